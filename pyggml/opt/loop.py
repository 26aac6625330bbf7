"""The loops: :func:`epoch`, :func:`fit` and :func:`evaluate` (``ggml_opt_epoch`` /
``ggml_opt_fit``'s sequence, run from Python), what they report (:class:`BatchInfo`,
:class:`EpochResult`, :class:`History`), the progress bar and Ctrl-C handling.
"""
from __future__ import annotations

import logging
import math
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Union

import numpy as np

from ..raw import callbacks, lib
from ..raw.boundary import calling
from .context import OptContext
from .dataset import Dataset
from .model import Model
from .optimizer import BuildType, Loss, OptimizerParams, Schedule
from .result import Metrics, Result

__all__ = ["BatchInfo", "EpochResult", "History", "epoch", "fit", "evaluate"]

logger = logging.getLogger("pyggml.opt")


@dataclass
class BatchInfo:
    """What a per-batch callback gets: ``train`` (False during validation/evaluation), the
    ``epoch`` (from 1), ``ibatch`` batches evaluated so far in this phase (from 1) of
    ``nbatches``, the phase's :class:`Result` so far, and ``seconds`` since the phase began."""
    train: bool
    epoch: int
    ibatch: int
    nbatches: int
    result: Result
    seconds: float

    @property
    def loss(self) -> float:
        return self.result.loss

    @property
    def accuracy(self) -> float:
        return self.result.accuracy


#: a per-batch callback; returning False stops training after this batch
BatchCallback = Callable[[BatchInfo], Union[bool, None]]


class _Progress:
    """One bar per phase: tqdm if available, else ggml's ``ggml_opt_epoch_callback_progress_bar``."""

    def __init__(self, enabled: bool | None):
        if enabled is None:
            enabled = sys.stderr is not None and hasattr(sys.stderr, "isatty") and sys.stderr.isatty()
        self.enabled = bool(enabled)
        self.bar: Any = None
        self.tqdm: Any = None
        if self.enabled:
            try:
                from tqdm import tqdm
                self.tqdm = tqdm
            except ImportError:
                self.tqdm = None

    def start(self, desc: str, total: int) -> None:
        self.close()
        if self.enabled and self.tqdm is not None:
            self.bar = self.tqdm(total=total, desc=desc, unit="batch", leave=True, file=sys.stderr,
                                 dynamic_ncols=True)

    def update(self, info: BatchInfo, octx: OptContext, dataset: Dataset, t_start_us: int) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            m = info.result.metrics()
            acc = "" if math.isnan(m.accuracy) else f" acc={100 * m.accuracy:.2f}±{100 * m.accuracy_unc:.2f}%"
            unc = "" if math.isnan(m.loss_unc) else f"±{m.loss_unc:.4f}"
            self.bar.set_postfix_str(f"loss={m.loss:.4f}{unc}{acc}", refresh=False)
            self.bar.update(1)
        else:  # ggml's own bar, on the C stderr
            sys.stderr.flush()
            lib.ggml_opt_epoch_callback_progress_bar(info.train, octx.ptr, dataset.ptr, info.result.ptr,
                                                     info.ibatch, info.nbatches, t_start_us)

    def write(self, text: str) -> None:
        if self.enabled:
            (self.tqdm.write if self.tqdm is not None else print)(text, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class _Interrupt:
    """Ctrl-C while training: the first one asks to stop after the current batch, a second one
    raises KeyboardInterrupt. Only in the main thread (where Python handles signals)."""

    def __init__(self) -> None:
        self.requested = False
        self._prev: Any = None
        self._installed = False
        self.progress: _Progress | None = None

    def _handler(self, signum: int, frame: Any) -> None:
        if self.requested:
            signal.signal(signal.SIGINT, self._prev)
            self._installed = False
            raise KeyboardInterrupt
        self.requested = True
        msg = "Ctrl-C: training stops after this batch (Ctrl-C again to stop at once)"
        if self.progress is not None and self.progress.enabled:
            self.progress.write(msg)
        else:
            logger.warning(msg)

    def __enter__(self) -> "_Interrupt":
        if threading.current_thread() is threading.main_thread():
            prev = signal.getsignal(signal.SIGINT)
            if prev is not signal.SIG_IGN and prev is not None:
                self._prev = prev
                signal.signal(signal.SIGINT, self._handler)
                self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._prev)
            self._installed = False


_NATIVE_LOCK = threading.Lock()


def epoch(opt_ctx: OptContext, dataset: Dataset, result_train: Result | None = None,
          result_eval: Result | None = None, idata_split: int = -1,
          callback: BatchCallback | None = None, *, progress: bool | None = None,
          native: bool = False, _interrupt: _Interrupt | None = None,
          _progress: _Progress | None = None) -> str | None:
    """One pass over ``dataset``, as ``ggml_opt_epoch``: train on the datapoints before
    ``idata_split`` (forward, backward, optimizer step every ``opt_period`` batches), then
    evaluate the rest (forward only); ``idata_split=-1`` trains on everything, 0 only
    evaluates. The dataset's current order is used (shuffle first: :meth:`Dataset.shuffle`).

    Loss and accuracy are added to ``result_train`` / ``result_eval``. ``callback(info)`` is
    called after every batch with a :class:`BatchInfo`; returning False stops after that batch.
    The optimizer schedule (if any) is evaluated for ``opt_ctx.current_epoch`` first, which is
    incremented afterwards if anything was trained.

    The loop is ggml_opt_epoch's, over the same public functions (``ggml_opt_alloc``,
    ``ggml_opt_dataset_get_batch``, ``ggml_opt_eval``), run from Python so that it can stop
    between batches. ``native=True`` calls ``ggml_opt_epoch`` itself, with the callback behind
    ggml's ``ggml_opt_epoch_callback`` (process-wide: one native epoch at a time); it stops
    only at the end of the epoch.

    Ctrl-C (main thread) while it trains stops it after the current batch; while it only
    evaluates, KeyboardInterrupt is raised as usual.

    Returns None, or why it stopped early: ``"callback"`` or ``"interrupt"`` (Ctrl-C).
    Raises ValueError/TypeError for a dataset that does not fit (:meth:`OptContext.check_dataset`)
    or an ``idata_split`` that is not a multiple of the batch size; re-raises what a callback
    raised.
    """
    opt_ctx.check_dataset(dataset)
    bs = opt_ctx.batch_size
    ndata = dataset.ndata
    nbatches = ndata // bs
    idata_split = ndata if idata_split < 0 else int(idata_split)
    if idata_split > ndata or idata_split % bs:
        raise ValueError(f"idata_split {idata_split} must be a multiple of the batch size {bs} and <= ndata {ndata}")
    ibatch_split = idata_split // bs
    if ibatch_split and opt_ctx.build_type == BuildType.FORWARD:
        raise ValueError("this OptContext evaluates only (build_type FORWARD): use idata_split=0")
    if opt_ctx._eval_ready:
        raise ValueError("alloc() was called without eval(): finish that batch first")
    results = {True: Result() if result_train is None else result_train,
               False: Result() if result_eval is None else result_eval}
    for r in results.values():
        r._accept(opt_ctx)
    ep = opt_ctx.current_epoch
    if ibatch_split:
        opt_ctx.params_for_epoch(ep)
    prog = _progress if _progress is not None else _Progress(progress)
    # Ctrl-C stops training cleanly; an evaluation alone has nothing to keep: KeyboardInterrupt
    own_interrupt = _interrupt is None and ibatch_split > 0
    intr: _Interrupt = _Interrupt() if _interrupt is None else _interrupt
    stopped: str | None = None
    try:
        if own_interrupt:
            intr.__enter__()
        intr.progress = prog
        if native:
            stopped = _native_epoch(opt_ctx, dataset, results, idata_split, ibatch_split, nbatches,
                                    ep, callback, prog, intr)
        else:
            for train, first, last in ((True, 0, ibatch_split), (False, ibatch_split, nbatches)):
                if last == first:
                    continue
                res = results[train]
                t0_us, t0 = lib.ggml_time_us(), time.perf_counter()
                prog.start(f"epoch {ep} {'train' if train else 'val'}", last - first)
                for ib in range(first, last):
                    opt_ctx.alloc(backward=train)
                    opt_ctx._get_batch(dataset, ib)
                    opt_ctx.eval(res)
                    info = BatchInfo(train, ep, ib + 1 - first, last - first, res, time.perf_counter() - t0)
                    prog.update(info, opt_ctx, dataset, t0_us)
                    if callback is not None and callback(info) is False:
                        stopped = "callback"
                    elif intr.requested:
                        stopped = "interrupt"
                    if stopped:
                        break
                prog.close()
                if stopped:
                    break
    finally:
        prog.close()
        if own_interrupt:
            intr.__exit__()
        if ibatch_split:
            opt_ctx.current_epoch = ep + 1
    return stopped


def _native_epoch(opt_ctx: OptContext, dataset: Dataset, results: dict[bool, Result], idata_split: int,
                  ibatch_split: int, nbatches: int, ep: int, callback: BatchCallback | None,
                  prog: _Progress, intr: _Interrupt) -> str | None:
    state: dict[str, Any] = {"stopped": None, "phase": None, "t0": 0.0}

    def on_batch(train: bool, octx_p: Any, ds_p: Any, result_p: Any, ibatch: int, ibatch_max: int,
                 t_start_us: int) -> None:
        train = bool(train)
        if state["phase"] != train:
            state["phase"], state["t0"] = train, time.perf_counter()
            prog.start(f"epoch {ep} {'train' if train else 'val'}", int(ibatch_max))
        info = BatchInfo(train, ep, int(ibatch), int(ibatch_max), results[train], time.perf_counter() - state["t0"])
        prog.update(info, opt_ctx, dataset, int(t_start_us))
        if int(ibatch) == int(ibatch_max):
            prog.close()
        if state["stopped"] is None:
            if callback is not None and callback(info) is False:
                state["stopped"] = "callback"
            elif intr.requested:
                state["stopped"] = "interrupt"

    with _NATIVE_LOCK:
        fn = callbacks.set_global("ggml_opt_epoch_callback", on_batch)
        try:
            with calling(opt_ctx.graph.ctx, opt_ctx):  # the scheduler, the epoch callback
                lib.ggml_opt_epoch(opt_ctx.ptr, dataset.ptr, results[True].ptr, results[False].ptr,
                                   idata_split, fn, fn)
        finally:
            callbacks.set_global("ggml_opt_epoch_callback", None)
    stopped: str | None = state["stopped"]
    return stopped


@dataclass
class EpochResult:
    """One epoch of :func:`fit`: training and validation :class:`Metrics` (``val`` None without
    a validation split) and wall-clock seconds."""
    epoch: int
    train: Metrics
    val: Metrics | None
    seconds: float


@dataclass
class History:
    """What :func:`fit` returns: the :class:`EpochResult` of each epoch trained (the last one
    possibly partial), and ``stopped``: None, ``"callback"`` or ``"interrupt"`` (Ctrl-C)."""
    epochs: list[EpochResult] = field(default_factory=list)
    stopped: str | None = None
    seconds: float = 0.0

    def __len__(self) -> int:
        return len(self.epochs)

    def __iter__(self) -> Iterator[EpochResult]:
        return iter(self.epochs)

    def __getitem__(self, i: int) -> EpochResult:
        return self.epochs[i]


def _split(ndata: int, nbatch_logical: int, opt_period: int, nbatch_physical: int, val_split: float) -> int:
    """``idata_split`` exactly as ``ggml_opt_fit`` computes it (float32 arithmetic)."""
    nbatches_logical = ndata // nbatch_logical
    frac = np.float32(1.0) - np.float32(val_split)
    ibatch_split = int(np.float32(frac * np.float32(nbatches_logical))) * opt_period
    return ibatch_split * nbatch_physical


def fit(model: Model, dataset: Dataset, *, batch_size: int, loss: "Loss | str" = Loss.CROSS_ENTROPY,
        optimizer: "OptimizerParams | Schedule | None" = None, epochs: int = 1,
        nbatch_logical: int | None = None, val_split: float = 0.0,
        callback: BatchCallback | None = None,
        epoch_callback: "Callable[[EpochResult], bool | None] | None" = None,
        progress: bool | None = None, native: bool = False) -> History:
    """Train ``model`` on ``dataset`` for ``epochs`` epochs, as ``ggml_opt_fit`` does.

    ``batch_size`` datapoints per physical batch (the graph's ``inputs ne[1]``);
    ``nbatch_logical`` (default ``batch_size``, a multiple of it) per optimizer step: the
    gradients of ``nbatch_logical / batch_size`` batches are accumulated (``opt_period``).
    ``val_split`` in [0, 1): the last fraction of the (shuffled) dataset, in whole logical
    batches, is evaluated after each epoch instead of trained on. ``loss``: a :class:`Loss`
    (or its name). ``optimizer``: :class:`AdamW` (default: ggml's defaults) or :class:`SGD`
    parameters, or a :data:`Schedule` ``epoch -> params`` (epochs from 1).

    The sequence is ggml_opt_fit's: a new :class:`OptContext`, one shuffle of all the data (if
    a logical batch is smaller than the dataset), then per epoch a shuffle of the training part
    and :func:`epoch`; with ggml's default AdamW the weights are bit for bit those of
    ``ggml_opt_fit``. Unlike ``ggml_opt_fit`` it shows a progress bar on a terminal
    (``progress``), calls ``callback`` after every batch (return False to stop), stops cleanly
    on Ctrl-C, and takes a Python optimizer schedule. ``epoch_callback(epoch_result)`` is called
    after every epoch with its :class:`EpochResult` (return False to stop). ``native=True`` runs
    each epoch with ``ggml_opt_epoch`` itself (see :func:`epoch`). The optimizer state (AdamW
    moments) is freed at the end, as in ggml.

    Returns a :class:`History`. Raises ValueError/TypeError for inputs ggml would abort on
    (sizes that do not divide, a ``val_split`` outside [0, 1), labels that do not fit the loss,
    ...: see :meth:`OptContext.check_dataset`); re-raises what a callback raised.
    """
    if not isinstance(epochs, (int, np.integer)) or epochs < 0:
        raise ValueError(f"epochs must be an integer >= 0, got {epochs!r}")
    if not isinstance(dataset, Dataset):
        raise TypeError(f"dataset must be an opt.Dataset, got {type(dataset).__name__}")
    dataset.check_batch_size(batch_size)
    nbatch_logical = batch_size if nbatch_logical is None else nbatch_logical
    if not isinstance(nbatch_logical, (int, np.integer)) or nbatch_logical < 1 or nbatch_logical % batch_size:
        raise ValueError(f"nbatch_logical {nbatch_logical} must be a multiple of batch_size {batch_size}")
    ndata = dataset.ndata
    if ndata % nbatch_logical:
        raise ValueError(f"nbatch_logical {nbatch_logical} does not divide the dataset's {ndata} datapoints "
                         "(ggml-opt has no partial batches): trim the data or pick a divisor")
    vs = float(val_split)
    if not 0.0 <= vs < 1.0:
        raise ValueError(f"val_split must be in [0, 1), got {val_split!r}")
    opt_period = nbatch_logical // batch_size
    idata_split = _split(ndata, nbatch_logical, opt_period, batch_size, vs)
    if idata_split == 0 and epochs:
        raise ValueError(f"val_split {val_split} leaves no logical batch of {nbatch_logical} to train on")
    history = History()
    t_fit = time.perf_counter()
    with OptContext(model, batch_size=batch_size, dataset=dataset, loss=loss, optimizer=optimizer,
                    opt_period=opt_period) as octx:
        octx.check_dataset(dataset)
        if nbatch_logical < ndata:
            dataset.shuffle(octx, -1)  # all data, train + validation
        prog = _Progress(progress)
        rt, rv = Result(), Result()
        with _Interrupt() as intr:
            for ep in range(1, epochs + 1):
                if nbatch_logical < idata_split:
                    dataset.shuffle(octx, idata_split)
                rt.reset()
                rv.reset()
                t0 = time.perf_counter()
                octx.current_epoch = ep
                stopped = epoch(octx, dataset, rt, rv, idata_split, callback, native=native,
                                _interrupt=intr, _progress=prog)
                er = EpochResult(ep, rt.metrics(), rv.metrics() if rv.ndata else None, time.perf_counter() - t0)
                history.epochs.append(er)
                logger.info("epoch %d/%d: train %s%s (%.2f s)", ep, epochs, er.train,
                            f"; val {er.val}" if er.val else "", er.seconds)
                if not stopped and epoch_callback is not None and epoch_callback(er) is False:
                    stopped = "callback"
                if stopped:
                    history.stopped = stopped
                    break
    history.seconds = time.perf_counter() - t_fit
    return history


def _eval_batch_size(ndata: int, shard: int, cap: int = 1000) -> int:
    """The largest multiple of ``shard`` dividing ``ndata`` that is <= ``cap`` (at least ``shard``)."""
    best = shard
    for b in range(shard, min(ndata, cap) + 1, shard):
        if ndata % b == 0:
            best = b
    return best


def evaluate(model: Model, dataset: Dataset, *, loss: "Loss | str" = Loss.CROSS_ENTROPY,
             batch_size: int | None = None, progress: bool | None = False) -> Result:
    """The loss (and for CROSS_ENTROPY the accuracy and predictions) of ``model`` on every
    datapoint of ``dataset`` in its current order, as ggml's MNIST example evaluates: a
    forward-only :class:`OptContext` and ``ggml_opt_epoch`` with ``idata_split = 0``.

    ``batch_size`` must divide ``ndata`` (default: the largest divisor <= 1000 that is a
    multiple of the shard size). Returns the :class:`Result`. Raises as :func:`epoch`.
    """
    bs = _eval_batch_size(dataset.ndata, dataset.shard_size) if batch_size is None else batch_size
    result = Result()
    with OptContext(model, batch_size=bs, dataset=dataset, loss=loss, build_type=BuildType.FORWARD) as octx:
        epoch(octx, dataset, None, result, 0, progress=progress)
    return result
