"""Training with ggml-opt (``ggml-opt.h``): datasets, AdamW/SGD, losses, epochs and fits.

ggml trains models itself: a ``ggml_opt_context`` builds the backward graph of a model and the
optimizer step (``ggml_opt_step_adamw`` / ``ggml_opt_step_sgd``), a ``ggml_opt_dataset`` holds
the data in host memory and copies shuffled batches to the model's inputs, and a
``ggml_opt_result`` accumulates loss and accuracy with their uncertainties. This package puts
those objects behind Python ones named as in ggml::

    import numpy as np
    from pyggml import opt

    class MLP(opt.Model):                         # ggml's MNIST "mnist-fc" architecture
        def __init__(self, rng, **kw):
            super().__init__(**kw)
            self.fc1_w = self.param("fc1.weight", rng.normal(0, 1e-2, (500, 784)))  # ne [784, 500]
            self.fc1_b = self.param("fc1.bias", rng.normal(0, 1e-2, 500))
            self.fc2_w = self.param("fc2.weight", rng.normal(0, 1e-2, (10, 500)))
            self.fc2_b = self.param("fc2.bias", rng.normal(0, 1e-2, 10))

        def forward(self, ctx, images):           # images: ne [784, batch]
            h = ctx.relu(ctx.add(ctx.mul_mat(self.fc1_w, images), self.fc1_b))
            return ctx.add(ctx.mul_mat(self.fc2_w, h), self.fc2_b)   # logits: ne [10, batch]

    model = MLP(np.random.default_rng(0))
    train = opt.Dataset(x_train, opt.one_hot(y_train, 10), shard_size=10)  # NumPy (n, 784), (n, 10)
    history = opt.fit(model, train, loss="cross_entropy", optimizer=opt.AdamW(alpha=1e-3),
                      epochs=30, batch_size=500, nbatch_logical=1000, val_split=0.05)
    print(opt.evaluate(model, opt.Dataset(x_test, opt.one_hot(y_test, 10))).accuracy)
    model.save("mnist-fc-f32.gguf", arch="mnist-fc")   # ggml's examples/mnist/mnist-eval reads it

**Shapes.** A dataset of ``ndata`` datapoints is given as NumPy arrays of shape
``(ndata, *datapoint_shape)`` and ``(ndata, *label_shape)``; ggml stores them flattened, as
tensors of ``ne [ne_datapoint, ndata]`` and ``ne [ne_label, ndata]`` (NumPy's last axis is
ggml's ``ne[0]``). A model's inputs tensor is ``ne [ne_datapoint, batch]`` and its outputs must
be ``ne [ne_label, batch]`` F32 (ggml-opt reads ``ne[1]`` as the number of datapoints).

**Errors.** Everything ggml-opt would ``GGML_ASSERT`` on (which kills the interpreter) is
checked first and raised as ValueError/TypeError: mismatched data/label counts, dtypes without
a ggml type, batch sizes that do not divide the dataset or are not a multiple of the shard size,
losses that need labels given a dataset without them (and the reverse), invalid optimizer
parameters, ops without a backward pass, graphs larger than ggml-opt's 2048-node graphs. An
exception raised by a Python callback (per-batch callback, optimizer schedule, a Python
backend's compute) is re-raised by the call that ran ggml.

**Ctrl-C** during :func:`fit` / :func:`epoch` (main thread) stops training cleanly after the
batch being computed: the model keeps every completed optimizer step and can be evaluated and
saved; :attr:`History.stopped <pyggml.opt.loop.History.stopped>` says ``"interrupt"``. A second
Ctrl-C raises KeyboardInterrupt at once (the interrupted optimizer step may then be partly
applied).

**Progress.** On a terminal (stderr a TTY) a bar per epoch and phase shows loss and accuracy
with ggml's uncertainties after each batch: tqdm's if it is installed (``pip install tqdm``),
else ggml's own ``ggml_opt_epoch_callback_progress_bar``. ``progress=False`` (and a stderr
that is not a TTY) keeps it quiet; per-epoch summaries go to the ``pyggml.opt`` logger (INFO).
"""
from __future__ import annotations

import logging

from .context import OptContext
from .dataset import Dataset, one_hot
from .loop import BatchInfo, EpochResult, History, epoch, evaluate, fit
from .model import GRAPH_SIZE, Model, ModelGraph
from .optimizer import SGD, AdamW, BuildType, Loss, OptimizerParams, Schedule, default_optimizer_params
from .result import Metrics, Result

__all__ = ["Loss", "BuildType", "AdamW", "SGD", "OptimizerParams", "Schedule", "default_optimizer_params",
           "Dataset", "Result", "Metrics", "Model", "ModelGraph", "OptContext", "BatchInfo",
           "EpochResult", "History", "epoch", "fit", "evaluate", "one_hot", "GRAPH_SIZE"]

logger = logging.getLogger("pyggml.opt")
