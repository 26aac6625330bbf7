"""pyggml.opt: training with ggml-opt from Python.

Learning is shown on small synthetic problems (on real data: tests/examples/test_train.py); the
Python loop is checked bit for bit against ``ggml_opt_fit``; every bad
input ggml-opt would abort on must raise instead (an abort would kill this test process).
"""
from __future__ import annotations

import collections
import math
import os
import re
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import ROOT
import pyggml
from pyggml import lib, opt
from pyggml.backends.device import device_by_name
from pyggml.enums import DeviceType
from pyggml.core.gguf import GGUFFile
from pyggml.types import GGMLType


# ---------------------------------------------------------------------------------------------
# helpers

def blobs(n: int = 256, dim: int = 8, classes: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian blobs: float32 (n, dim), int64 class indices (n,)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 3, (classes, dim))
    y = rng.integers(0, classes, n)
    return (centers[y] + rng.normal(0, 1, (n, dim))).astype(np.float32), y


class MLP(opt.Model):
    def __init__(self, n_in: int = 8, n_hidden: int = 16, n_out: int = 4, seed: int = 0, **kw):
        kw.setdefault("n_threads", 1)
        super().__init__(**kw)
        rng = np.random.default_rng(seed)
        self.w1 = self.param("fc1.weight", rng.normal(0, 0.3, (n_hidden, n_in)))
        self.b1 = self.param("fc1.bias", np.zeros(n_hidden))
        self.w2 = self.param("fc2.weight", rng.normal(0, 0.3, (n_out, n_hidden)))
        self.b2 = self.param("fc2.bias", np.zeros(n_out))

    def forward(self, ctx, x):
        h = ctx.relu(ctx.add(ctx.mul_mat(self.w1, x), self.b1))
        return ctx.add(ctx.mul_mat(self.w2, h), self.b2)


def blob_data(n: int = 256, **kw) -> opt.Dataset:
    x, y = blobs(n)
    return opt.Dataset(x, opt.one_hot(y, 4), **kw)


# ---------------------------------------------------------------------------------------------
# the loop is ggml's

def _fc_with(init: dict[str, np.ndarray]) -> opt.Model:
    m = opt.Model(n_threads=2)
    p = {k: m.param(k, v) for k, v in init.items()}
    m._forward = lambda ctx, x: ctx.add(ctx.mul_mat(p["w2"], ctx.relu(ctx.add(ctx.mul_mat(p["w1"], x), p["b1"]))), p["b2"])
    return m


def test_fit_is_bit_for_bit_ggml_opt_fit():
    """Same weights after 3 epochs as ggml_opt_fit itself: gradient accumulation (opt_period
    2), a validation split, shards of 4, shuffles from the opt context's generator."""
    x, y = blobs(480, dim=8)
    rng = np.random.default_rng(1)
    init = {"w1": rng.normal(0, 0.3, (16, 8)), "b1": np.zeros(16), "w2": rng.normal(0, 0.3, (4, 16)), "b2": np.zeros(4)}
    data = lambda: opt.Dataset(x, opt.one_hot(y, 4), shard_size=4)  # noqa: E731
    ours, native, ref = _fc_with(init), _fc_with(init), _fc_with(init)
    kw = dict(batch_size=16, nbatch_logical=32, epochs=3, val_split=0.1, progress=False)
    h = opt.fit(ours, data(), **kw)
    hn = opt.fit(native, data(), native=True, **kw)
    g, ref_data = ref.graph(16, 8), data()  # (keep the Dataset alive while C uses its pointer)
    lib.ggml_opt_fit(g.sched.ptr, g.ctx.ptr, g.inputs.ptr, g.outputs.ptr, ref_data.ptr,
                     lib.GGML_OPT_LOSS_TYPE_CROSS_ENTROPY, lib.GGML_OPT_OPTIMIZER_TYPE_ADAMW,
                     lib.ggml_opt_get_default_optimizer_params, 3, 32, 0.1, True)
    a, b, c = ours.state_dict(), native.state_dict(), ref.state_dict()
    assert not np.array_equal(a["w1"], init["w1"].astype(np.float32))
    for k in a:
        assert np.array_equal(a[k], c[k]), k
        assert np.array_equal(b[k], c[k]), k
    assert h[-1].train.ndata == hn[-1].train.ndata == 416 and h[-1].val.ndata == 64  # (1 - 0.1) * 15 -> 13 logical batches
    assert h[-1].train == hn[-1].train and h[-1].val == hn[-1].val
    g.close()


def test_own_epoch_loop_with_optcontext():
    """A PyTorch-style loop: one OptContext (AdamW state kept), epoch() then evaluate()."""
    model = MLP()
    data, test = blob_data(256), blob_data(64)
    seen = []
    with opt.OptContext(model, batch_size=32, dataset=data, optimizer=lambda e: seen.append(e) or opt.AdamW(alpha=0.01 / e)) as octx:
        assert octx.optimizer_name == "adamw" and octx.static_graphs
        assert octx.labels.ne[:2] == (4, 32) and octx.pred.type == GGMLType.I32
        assert octx.grad_acc(model.w1) is None  # opt_period 1: ggml steps from the gradients directly
        losses = []
        for _ in range(4):
            data.shuffle(octx)
            r = opt.Result()
            assert opt.epoch(octx, data, r) is None
            losses.append(r.loss)
        assert octx.current_epoch == 5
        assert octx.loss.numpy().shape == (1,)
        assert 0 <= int(octx.ncorrect.numpy()[0]) <= 32
    assert seen == [1, 1, 2, 3, 4]  # epoch 1 is asked when the OptContext is made, to learn the optimizer
    assert losses[-1] < losses[0]
    assert opt.evaluate(model, test).accuracy > 0.9


# ---------------------------------------------------------------------------------------------
# backends

def test_numpy_backend_trains_under_the_scheduler(monkeypatch):
    """Linear regression trained with the NumPy backend (written in Python) as the primary
    backend: it computes the forward and backward nodes; the scheduler gives the AdamW step,
    which it lacks, to the CPU."""
    from pyggml.impl import numpy as numpy_backend

    numpy_backend.register()

    counts: collections.Counter = collections.Counter()
    compute = numpy_backend.NumpyBackend.graph_compute

    def counting(self, graph):
        counts.update(n.op_name for n in graph.nodes
                      if not n.is_empty_op() and n.flags & lib.GGML_TENSOR_FLAG_COMPUTE)
        return compute(self, graph)

    monkeypatch.setattr(numpy_backend.NumpyBackend, "graph_compute", counting)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 4)).astype(np.float32)
    w_true = np.array([[1.0, -2.0, 0.5, 3.0]], np.float32)
    y = x @ w_true.T + 0.25
    model = opt.Model("NUMPY", n_threads=1)
    assert [b.name for b in model.backends] == ["NUMPY", "CPU"]
    w, b = model.param("w", np.zeros((1, 4))), model.param("b", np.zeros(1))
    model._forward = lambda ctx, t: ctx.add(ctx.mul_mat(w, t), b)
    h = opt.fit(model, opt.Dataset(x, y), batch_size=32, loss="mse", optimizer=opt.AdamW(alpha=0.05),
                epochs=20, progress=False)
    assert h[-1].train.loss < 1e-3 * h[0].train.loss
    np.testing.assert_allclose(model.state_dict()["w"], w_true, atol=0.02)
    assert {"MUL_MAT", "OUT_PROD", "REPEAT_BACK", "SQR", "SUM"} <= set(counts)
    assert "OPT_STEP_ADAMW" not in counts and counts["MUL_MAT"] >= 20 * 8


@pytest.mark.parametrize("name", [d.name for d in pyggml.devices() if d.type in (DeviceType.GPU, DeviceType.IGPU)])
def test_gpu_devices_train(name):
    """Every GPU of this build (CUDA, Vulkan...) as the primary backend: the blobs are learned.

    Run in a child process: on Mesa's lavapipe (the Vulkan device of scripts/check_variants.sh,
    Debian 12's Mesa 22.3) training sometimes dies of heap corruption inside the driver. Valgrind
    shows why: libvulkan_lvp.so's queue thread frees, then reads and frees again, the buffer
    objects ggml-vulkan created (in ggml_opt_init and the scheduler's reserve) -- all inside the
    driver, no pyggml or ggml frame on that thread. There, and only there, such a death is an
    expected failure; a wrong accuracy fails on every device."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT / "tests")!r})
        from test_opt import MLP, blob_data, opt
        model = MLP(backend={name!r})
        opt.fit(model, blob_data(256), batch_size=32, epochs=15, optimizer=opt.AdamW(alpha=0.01), progress=False)
        print("accuracy", opt.evaluate(model, blob_data(64)).accuracy)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    lavapipe = "llvmpipe" in device_by_name(name).description
    if r.returncode == -signal.SIGABRT and lavapipe and re.search(r"corrupted|double free|free\(\)", r.stderr):
        pytest.xfail(f"lavapipe corrupted the heap: {r.stderr.strip().splitlines()[0]}")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    accuracy = float(re.search(r"^accuracy (\S+)$", r.stdout, re.M).group(1))
    assert accuracy > 0.9


# ---------------------------------------------------------------------------------------------
# results, progress, callbacks, schedules

def test_result_uncertainties_are_ggmls():
    model = MLP()
    data = blob_data(256)
    opt.fit(model, data, batch_size=32, epochs=3, optimizer=opt.AdamW(alpha=0.01), progress=False)
    r = opt.evaluate(model, data, batch_size=32)
    m = r.metrics()
    assert m.ndata == 256 and r.ndata == 256
    assert m.accuracy_unc == pytest.approx(math.sqrt(m.accuracy * (1 - m.accuracy) / 255))
    one = opt.evaluate(model, data, batch_size=256)  # one batch: no loss uncertainty
    assert math.isnan(one.loss_unc) and one.loss == pytest.approx(m.loss, rel=1e-5)
    mse = opt.evaluate(model, opt.Dataset(*blobs(64)[:1], np.zeros((64, 4), np.float32)), loss="mse")
    assert math.isnan(mse.accuracy)
    with pytest.raises(ValueError, match="no predictions"):
        mse.pred()


def test_sgd_and_schedule():
    model = MLP()
    asked = []

    def schedule(epoch):
        asked.append(epoch)
        return opt.SGD(alpha=0.1 * 0.5 ** (epoch - 1))

    h = opt.fit(model, blob_data(256), batch_size=32, epochs=4, optimizer=schedule, progress=False)
    assert asked == [1, 1, 2, 3, 4]
    assert h[-1].train.loss < h[0].train.loss
    assert opt.evaluate(model, blob_data(64)).accuracy > 0.9


def test_callback_stops_and_sees_progress():
    infos = []

    def cb(info):
        infos.append((info.train, info.epoch, info.ibatch, info.nbatches, info.result.ndata, info.loss))
        return not (info.epoch == 2 and info.ibatch == 3)

    model = MLP()
    h = opt.fit(model, blob_data(256), batch_size=32, epochs=5, val_split=0.25, callback=cb, progress=False)
    assert h.stopped == "callback" and len(h) == 2
    assert infos[0][:5] == (True, 1, 1, 6, 32)  # 8 batches, 6 trained, 2 validated
    assert infos[6][:5] == (False, 1, 1, 2, 32)
    assert infos[-1][:5] == (True, 2, 3, 6, 96)
    assert h[-1].train.ndata == 96 and h[-1].val is None


def test_epoch_callback_stops():
    model = MLP()
    h = opt.fit(model, blob_data(256), batch_size=32, epochs=10, progress=False,
                epoch_callback=lambda e: e.epoch < 3)
    assert len(h) == 3 and h.stopped == "callback"


def test_progress_bar_tqdm_and_quiet(capsys):
    pytest.importorskip("tqdm")
    model = MLP()
    opt.fit(model, blob_data(256), batch_size=32, epochs=1, val_split=0.25, progress=True)
    err = capsys.readouterr().err
    assert "epoch 1 train" in err and "epoch 1 val" in err and "loss=" in err and "acc=" in err
    opt.fit(model, blob_data(256), batch_size=32, epochs=1)  # stderr is not a TTY here: quiet
    assert capsys.readouterr().err == ""


def test_progress_bar_falls_back_to_ggmls(capfd, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # "import tqdm" raises ImportError
    opt.fit(MLP(), blob_data(256), batch_size=32, epochs=1, progress=True)
    err = capfd.readouterr().err
    assert "train: [" in err and "data=0000256/0000256" in err and "acc=" in err


# ---------------------------------------------------------------------------------------------
# Ctrl-C

def test_ctrl_c_stops_after_the_batch_and_keeps_the_model(default_sigint):
    model = MLP()
    before = model.state_dict()

    def cb(info):
        if info.epoch == 2 and info.ibatch == 2:
            os.kill(os.getpid(), signal.SIGINT)

    h = opt.fit(model, blob_data(256), batch_size=32, epochs=5, callback=cb, progress=False)
    assert h.stopped == "interrupt" and len(h) == 2 and h[-1].train.ndata == 64
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert not np.array_equal(before["fc1.weight"], model.state_dict()["fc1.weight"])
    assert opt.evaluate(model, blob_data(64)).ndata == 64


def test_second_ctrl_c_raises_keyboard_interrupt(default_sigint):
    def cb(info):
        if info.ibatch == 2:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        opt.fit(MLP(), blob_data(256), batch_size=32, epochs=3, callback=cb, progress=False)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_during_an_evaluation_raises(default_sigint):
    """Only training is stopped cleanly: an evaluation has nothing to keep."""
    model, data = MLP(), blob_data(64)
    with opt.OptContext(model, batch_size=32, dataset=data, build_type="forward") as octx:
        with pytest.raises(KeyboardInterrupt):
            opt.epoch(octx, data, None, opt.Result(), 0, callback=lambda info: os.kill(os.getpid(), signal.SIGINT))
    assert opt.evaluate(model, data).ndata == 64


def test_ctrl_c_from_outside_in_a_real_process(tmp_path, default_sigint):
    """SIGINT sent to a training process: it stops cleanly, saves, exits 0."""
    script = tmp_path / "train_forever.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT / 'tests')!r})
        from test_opt import MLP, blob_data
        from pyggml import opt
        model = MLP(n_hidden=256)
        started = []
        def cb(info):
            if not started:
                started.append(1)
                print("started", flush=True)
        h = opt.fit(model, blob_data(4096), batch_size=32, epochs=10000, callback=cb, progress=False)
        model.save({str(tmp_path / 'm.gguf')!r})
        print("stopped", h.stopped, len(h), flush=True)
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env, preexec_fn=default_sigint.preexec)
    try:
        assert p.stdout.readline().strip() == "started"
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 0, err
    assert out.startswith("stopped interrupt")
    with GGUFFile(tmp_path / "m.gguf") as f:
        assert {t.name for t in f.tensors} == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}


# ---------------------------------------------------------------------------------------------
# save and load

def test_save_and_load_gguf(tmp_path):
    model = MLP(seed=0)
    opt.fit(model, blob_data(256), batch_size=32, epochs=2, progress=False)
    path = tmp_path / "mlp.gguf"
    model.save(path, arch="blob-mlp", metadata={"train.epochs": 2})
    with GGUFFile(path) as f:
        assert f.metadata["general.architecture"] == "blob-mlp" and f.metadata["train.epochs"] == 2
        assert f.tensor_info("fc1.weight").ne == (8, 16)
        np.testing.assert_array_equal(f.array("fc2.bias"), model.state_dict()["fc2.bias"])
    again = MLP(seed=5)
    meta = again.load(path)
    assert meta["general.architecture"] == "blob-mlp"
    x = blobs(64, seed=3)[0]
    np.testing.assert_array_equal(again.predict(x), model.predict(x))
    np.testing.assert_array_equal(again.predict(x, batch_size=7), model.predict(x))  # padded last batch
    with pytest.raises(ValueError, match="ne"):
        MLP(n_hidden=8).load(path)
    with pytest.raises(KeyError, match="missing"):
        _other_names().load(path)


def _other_names() -> opt.Model:
    m = opt.Model(n_threads=1)
    m.param("something.else", np.zeros(3))
    return m


# ---------------------------------------------------------------------------------------------
# bad input: Python exceptions, never an abort

def test_dataset_bad_input():
    x, y = blobs(64)
    with pytest.raises(ValueError, match="datapoints"):
        opt.Dataset(x, opt.one_hot(y, 4)[:63])
    with pytest.raises(ValueError, match="at least one"):
        opt.Dataset(np.zeros((0, 8), np.float32))
    with pytest.raises(TypeError, match="one_hot"):
        opt.Dataset(x, y)  # class indices
    with pytest.raises(TypeError, match="uint8"):
        opt.Dataset((x * 10).astype(np.uint8))
    with pytest.raises(TypeError):
        opt.Dataset(np.array([["a"]] * 4))
    with pytest.raises(TypeError, match="integer"):
        opt.Dataset(x, type=GGMLType.I32)
    with pytest.raises(ValueError, match="shard_size"):
        opt.Dataset(x, shard_size=5)
    with pytest.raises(ValueError, match="block size"):
        opt.Dataset(x, type=GGMLType.Q8_0)  # 8 elements per datapoint, Q8_0 blocks hold 32
    with pytest.raises(ValueError):
        opt.one_hot(y, 3)
    d = opt.Dataset(x, opt.one_hot(y, 4), shard_size=4)
    with pytest.raises(ValueError, match="multiple of the dataset's shard size"):
        d.get_batch(0, 6)
    with pytest.raises(ValueError, match="beyond"):
        d.get_batch(2, 32)


def test_dataset_types_and_batches():
    x, y = blobs(64)
    d = opt.Dataset(x, opt.one_hot(y, 4), shard_size=2, seed=3)
    assert (d.ndata, d.ne_datapoint, d.ne_label, d.type, d.label_type) == (64, 8, 4, GGMLType.F32, GGMLType.F32)
    assert d.data.ne[:2] == (8, 64) and d.labels.ne[:2] == (4, 64)
    bx, by = d.get_batch(1, 8)  # stored order: shards permuted by the seed
    order = np.random.default_rng(3).permutation(32)
    rows = (order[:, None] * 2 + np.arange(2)).reshape(-1)[8:16]
    np.testing.assert_array_equal(bx, x[rows])
    np.testing.assert_array_equal(by, opt.one_hot(y, 4)[rows])
    h = opt.Dataset(x.astype(np.float16))
    assert h.type == GGMLType.F16 and h.get_batch(0, 4)[0].dtype == np.float16 and h.get_batch(0, 4)[1] is None
    q = opt.Dataset(np.tile(x, (1, 4)), type=GGMLType.Q8_0)
    np.testing.assert_allclose(q.get_batch(0, 4)[0], np.tile(x, (1, 4))[:4], atol=0.05)
    assert opt.Dataset(np.arange(8, dtype=np.int32)).type == GGMLType.I32


def test_fit_bad_sizes_and_losses():
    model = MLP()
    data = blob_data(256, shard_size=4)
    for kw, match in [(dict(batch_size=6), "shard size"),
                      (dict(batch_size=4 * 7), "does not divide"),
                      (dict(batch_size=32, nbatch_logical=48), "multiple of batch_size"),
                      (dict(batch_size=32, val_split=1.0), r"val_split"),
                      (dict(batch_size=32, val_split=-0.1), r"val_split"),
                      (dict(batch_size=128, nbatch_logical=256, val_split=0.4), "leaves no logical batch"),
                      (dict(batch_size=32, epochs=-1), "epochs")]:
        with pytest.raises(ValueError, match=match):
            opt.fit(model, data, progress=False, **kw)
    with pytest.raises(ValueError, match="takes no labels"):
        opt.fit(model, data, batch_size=32, loss="mean", progress=False)
    with pytest.raises(ValueError, match="needs labels"):
        opt.fit(model, opt.Dataset(blobs(256)[0]), batch_size=32, progress=False)
    with pytest.raises(ValueError, match="one-hot"):
        opt.fit(model, opt.Dataset(blobs(256)[0], blobs(256)[1].astype(np.float32)), batch_size=32, progress=False)
    with pytest.raises(TypeError, match="F16"):
        opt.fit(model, opt.Dataset(blobs(256)[0], opt.one_hot(blobs(256)[1], 4, np.float16)), batch_size=32,
                progress=False)
    with pytest.raises(ValueError, match="mul_mat"):  # the graph is built for 9 inputs: pyggml's op check
        opt.fit(model, opt.Dataset(np.zeros((256, 9), np.float32), np.zeros((256, 4), np.float32)),
                batch_size=32, progress=False)
    with pytest.raises(ValueError, match="no backend .* can compute MUL_MAT of f32, f16"):
        opt.fit(model, opt.Dataset(blobs(256)[0].astype(np.float16), np.zeros((256, 4), np.float32)),
                batch_size=32, progress=False)
    with pytest.raises(ValueError, match="unknown loss"):
        opt.fit(model, data, batch_size=32, loss="hinge", progress=False)
    assert opt.evaluate(model, blob_data(64)).ndata == 64  # the model is unharmed


def test_fit_refuses_a_gradient_layout_the_cpu_kernel_would_scramble():
    """A pool followed by a permute (the flatten of ggml's MNIST CNN) hands POOL_2D_BACK a
    permuted gradient, which ggml's CPU kernel reads as packed planes: fit refuses the model
    before training, and says how to fix it (pyggml.backends.cpu's kernel table)."""
    def forward(ctx, x):                                     # x: ne [32, batch]
        img = ctx.reshape(x, 4, 4, 2, x.ne[1])
        p = ctx.pool_2d(ctx.mul(img, w), "max", 2, 2, 2, 2)  # ne [2, 2, 2, batch]
        return ctx.reshape(ctx.cont(ctx.permute(p, 1, 2, 0, 3)), 8, x.ne[1])

    model = opt.Model(forward=forward, n_threads=1)
    w = model.param("w", np.ones((2, 4, 4)))
    rng = np.random.default_rng(0)
    data = opt.Dataset(rng.standard_normal((256, 32)).astype(np.float32),
                       opt.one_hot(rng.integers(0, 8, 256), 8))
    with pytest.raises(ValueError, match=r"POOL_2D_BACK .*: CPU: .*make it contiguous with Context.cont"):
        opt.fit(model, data, batch_size=32, progress=False)


def test_a_parameter_used_only_through_a_transpose_is_refused_without_gradient_accumulation():
    """ggml's gradient of a parameter that reaches the loss only through a transpose is a
    transposed view, and ggml-opt's optimizer steps read it at the parameter's strides with no
    assert: fit trained such a model with scrambled updates, silently (SGD: weights 0.15 off
    after one epoch). fit refuses it; with gradient accumulation (the step reads ggml-opt's
    contiguous accumulator) it trains exactly as the model storing the parameter as used."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 8)).astype(np.float32)
    y = rng.standard_normal((64, 4)).astype(np.float32)
    w = rng.normal(0, 0.3, (4, 8))

    def model(transposed: bool) -> opt.Model:
        m = opt.Model(n_threads=1)
        if transposed:
            wt = m.param("w", w.T)  # ne [4, 8]: used as its transpose, ne [8, 4]
            m._forward = lambda ctx, inp: ctx.mul_mat(ctx.cont(ctx.transpose(wt)), inp)
        else:
            p = m.param("w", w)
            m._forward = lambda ctx, inp: ctx.mul_mat(p, inp)
        return m

    kw = dict(batch_size=32, loss="mse", optimizer=opt.SGD(alpha=0.1), progress=False)
    with pytest.raises(ValueError, match="'w' reaches the loss only through a transpose"):
        opt.fit(model(True), opt.Dataset(x, y), **kw)
    plain, transposed = model(False), model(True)
    for m in (plain, transposed):
        opt.fit(m, opt.Dataset(x, y), nbatch_logical=64, **kw)
    assert not np.array_equal(plain.state_dict()["w"], w.astype(np.float32))
    np.testing.assert_array_equal(transposed.state_dict()["w"].T, plain.state_dict()["w"])

def test_bad_optimizer_parameters():
    for make, match in [(lambda: opt.AdamW(alpha=0), "alpha"), (lambda: opt.AdamW(beta1=1.5), "beta1"),
                        (lambda: opt.AdamW(beta2=-0.1), "beta2"), (lambda: opt.AdamW(eps=-1), "eps"),
                        (lambda: opt.AdamW(wd=2), "wd"), (lambda: opt.SGD(alpha=-1), "alpha"),
                        (lambda: opt.SGD(wd=float("nan")), "wd")]:
        with pytest.raises(ValueError, match=match):
            make()
    model = MLP()
    with pytest.raises(ValueError, match="float32"):
        opt.fit(model, blob_data(), batch_size=32, optimizer=opt.AdamW(alpha=1e-50), progress=False)
    with pytest.raises(TypeError, match="AdamW"):
        opt.fit(model, blob_data(), batch_size=32, optimizer="adam", progress=False)
    with pytest.raises(TypeError, match="schedule returned SGD"):
        opt.fit(model, blob_data(), batch_size=32, epochs=3, progress=False,
                optimizer=lambda e: opt.AdamW() if e == 1 else opt.SGD())
    with pytest.raises(ValueError, match="alpha"):
        opt.fit(model, blob_data(), batch_size=32, epochs=3, progress=False,
                optimizer=lambda e: opt.AdamW(alpha=1e-3 if e < 3 else 0.0))


class Boom(Exception):
    pass


def test_raising_callbacks_are_reraised():
    model = MLP()

    def schedule(epoch):
        if epoch == 2:
            raise Boom("schedule")
        return opt.AdamW()

    with pytest.raises(Boom, match="schedule"):
        opt.fit(model, blob_data(), batch_size=32, epochs=3, optimizer=schedule, progress=False)

    def cb(info):
        if info.ibatch == 3:
            raise Boom("batch")

    with pytest.raises(Boom, match="batch"):
        opt.fit(model, blob_data(), batch_size=32, epochs=3, callback=cb, progress=False)
    calls = []

    def native_cb(info):  # called by ggml_opt_epoch through ggml_opt_epoch_callback
        calls.append(info.ibatch)
        raise Boom("native")

    with pytest.raises(Boom, match="native"):
        opt.fit(model, blob_data(), batch_size=32, epochs=3, callback=native_cb, native=True, progress=False)
    assert calls == list(range(1, 9))  # ggml_opt_epoch finishes its epoch, then the error surfaces
    assert opt.evaluate(model, blob_data(64)).ndata == 64


def test_bad_models():
    data = blob_data(64)
    no_grad = MLP()
    no_grad.forward = lambda ctx, x: ctx.add(ctx.mul_mat(no_grad.w2, ctx.tanh(ctx.mul_mat(no_grad.w1, x))), no_grad.b2)
    with pytest.raises(ValueError, match="no backward pass"):
        opt.fit(no_grad, data, batch_size=32, progress=False)
    assert opt.evaluate(no_grad, data).ndata == 64  # the forward pass is fine

    flat = MLP()
    flat.forward = lambda ctx, x: ctx.sum(ctx.mul_mat(flat.w1, x))
    with pytest.raises(ValueError, match=r"ne \[n_outputs, batch_size=32\]"):
        opt.fit(flat, data, batch_size=32, progress=False)

    lossy = MLP()

    def with_loss(ctx, x):
        out = MLP.forward(lossy, ctx, x)
        extra = ctx.sum(out).set_loss()  # an extra loss term inside the model
        return ctx.add(out, ctx.repeat(extra, out))

    lossy.forward = with_loss
    with pytest.raises(ValueError, match="marked as a loss"):
        opt.fit(lossy, data, batch_size=32, progress=False)

    frozen = opt.Model(n_threads=1)
    w = frozen.param("w", np.ones((4, 8)), trainable=False)
    frozen._forward = lambda ctx, x: ctx.mul_mat(w, x)
    with pytest.raises(ValueError, match="no trainable parameter"):
        opt.fit(frozen, data, batch_size=32, progress=False)

    not_tensor = MLP()
    not_tensor.forward = lambda ctx, x: np.zeros(3)
    with pytest.raises(TypeError, match="Tensor"):
        opt.fit(not_tensor, data, batch_size=32, progress=False)

    late = MLP()
    late.allocate()
    with pytest.raises(ValueError, match="already allocated"):
        late.param("late", np.zeros(2))
    with pytest.raises(ValueError, match="duplicate"):
        MLP().param("fc1.bias", np.zeros(2))


def test_low_level_misuse_raises():
    model = MLP()
    data = blob_data(64)
    with opt.OptContext(model, batch_size=32, dataset=data, build_type="forward") as octx:
        with pytest.raises(ValueError, match="forward pass only"):
            octx.alloc(backward=True)
        with pytest.raises(ValueError, match="alloc"):
            octx.eval()
        with pytest.raises(ValueError, match="FORWARD"):
            opt.epoch(octx, data, idata_split=32)
        with pytest.raises(ValueError, match="grad_acc"):
            octx.grad_acc(model.w1)
        with pytest.raises(ValueError, match="multiple of the batch size"):
            opt.epoch(octx, data, idata_split=16)
        octx.alloc(backward=False)
        with pytest.raises(ValueError, match="already called"):
            octx.alloc(backward=False)
        octx.get_batch(data, 1)
        r = opt.Result()
        octx.eval(r)
        assert r.ndata == 32
        with pytest.raises(ValueError, match="> ndata"):
            data.shuffle(octx, 65)
        with pytest.raises(ValueError, match="shard size"):
            blob_data(64, shard_size=4).shuffle(octx, 6)
        with pytest.raises(ValueError, match="beyond"):
            octx.get_batch(data, 2)
    with opt.OptContext(model, batch_size=16, dataset=data, build_type="forward") as other:
        with pytest.raises(ValueError, match="another batch size"):
            opt.epoch(other, data, None, r, 0)
    with pytest.raises(ValueError, match="opt_period"):
        opt.OptContext(model, batch_size=32, dataset=data, opt_period=0)
    with pytest.raises(ValueError, match="build_type"):
        opt.OptContext(model, batch_size=32, dataset=data, build_type="backward")
    with pytest.raises(ValueError, match="GRAD"):  # ggml_opt_init would abort (ggml-opt.cpp:501)
        opt.OptContext(model, batch_size=32, dataset=data, build_type="grad", opt_period=2)
