"""Sphinx configuration of pyggml's reference documentation.

Build (warnings are errors, as in CI through tests/test_docs.py)::

    sphinx-build -W --keep-going -b html docs docs/_build/html

autodoc imports pyggml, so the package must be built: an installed pyggml wins; otherwise the
checkout's (``python build_ggml.py``) is used. Nothing is fetched: no intersphinx, no theme from
outside Sphinx itself.
"""
from __future__ import annotations

import builtins
import importlib
import importlib.util
import sys
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx import addnodes
from sphinx.ext.napoleon import Config as NapoleonConfig
from sphinx.ext.napoleon.docstring import GoogleDocstring
from sphinx.transforms.post_transforms import SphinxPostTransform

ROOT = Path(__file__).resolve().parents[1]
# appended, as tests/conftest.py does: an installed pyggml wins over the source tree's, and the
# build-time package pyggml_build (never installed) is found in the checkout
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

import pyggml  # noqa: E402
from pyggml.core._unchecked_ops import UNCHECKED_OPS, UncheckedOps  # noqa: E402

project = "pyggml"
author = "pyggml contributors"
copyright = "pyggml contributors"
release = version = pyggml.__version__

extensions = ["sphinx.ext.autodoc"]  # napoleon: see _napoleon below; no intersphinx (offline)
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_theme_options = {"description": f"ggml {pyggml.GGML_VERSION} from Python",
                      "fixed_sidebar": True, "page_width": "1240px", "sidebar_width": "240px",
                      "code_font_size": "0.8em"}
html_static_path: list[str] = []
html_show_sourcelink = False
toc_object_entries = False  # tables of contents list the pages' sections, not every API object
# substitutions every page may use
rst_epilog = f"""
.. |ggml_version| replace:: {pyggml.GGML_VERSION}
"""

# -- autodoc ------------------------------------------------------------------------------------
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# pyggml.impl.torch needs the optional torch: without it, its reference is made from a mock
if importlib.util.find_spec("torch") is None:
    autodoc_mock_imports = ["torch"]
autodoc_default_options = {"members": True, "undoc-members": True, "show-inheritance": True}
autoclass_content = "both"
add_module_names = False

# -- every cross-reference must resolve (nitpicky), except to what lives outside pyggml ---------
nitpicky = True
nitpick_ignore_regex = [
    # the standard library, NumPy, cffi and torch (fx: torch.fx): no intersphinx (the build makes no
    # network request)
    (r"py:.*", r"(builtins|os|sys|pathlib|typing|collections|enum|logging|math|threading|weakref|"
               r"contextlib|subprocess|types|abc|pycparser|numpy|np|cffi|_cffi_backend|torch|fx)(\..*)?"),
    (r"py:.*", r"(Any|Callable|Iterable|Iterator|Mapping|Sequence|Path|PathLike|IntEnum|IntFlag|"
               r"ndarray|DTypeLike|ArrayLike|Self|Logger|TracebackType|FFI|CData)"),
    # type variables, and private helpers (not in this reference) that docstrings name
    (r"py:.*", r"(pyggml\.[\w.]*\.)?(E|T|R)"),
    (r"py:.*", r"([\w.]*\.)?_\w+"),
    # generic aliases Sphinx cannot parse into one name (``dict[str, Pin]``, string forward refs)
    (r"py:class", r".*\[.*"),
]


# -- napoleon, for Google/NumPy-style sections, on callables and modules only ---------------------
# pyggml's docstrings are reST prose. Napoleon reads a property or attribute docstring such as
# "Stride in bytes per dimension (ggml order): ..." as "<type>: <description>" and turns the prose
# into a broken type reference, so it is not applied to attributes, data and properties.
_NAPOLEON = NapoleonConfig(napoleon_google_docstring=True, napoleon_numpy_docstring=False)


def _napoleon(app, what, name, obj, options, lines):
    if what in ("attribute", "data", "property"):
        return
    lines[:] = GoogleDocstring(lines, _NAPOLEON, app, what, name, obj, options).lines()


# -- op constructors ----------------------------------------------------------------------------
def _is_unchecked_op(obj) -> bool:
    """The generated methods of :class:`pyggml.core._unchecked_ops.UncheckedOps`: the op constructors
    without checks of their own (``pyggml/core/_unchecked_ops.py``, written by the build)."""
    name = getattr(obj, "__name__", None)
    return name in UNCHECKED_OPS and vars(UncheckedOps).get(name) is obj


# (Context's own methods, such as dup_tensor, are not among them)
_UNCHECKED = sorted(UNCHECKED_OPS)


def _skip(app, what, name, obj, skip, options):
    if _is_unchecked_op(obj):
        return True  # listed once by the unchecked-ops directive instead of ~160 times
    return None


class UncheckedOps(Directive):
    """``.. unchecked-ops::``: the op constructors reached through :meth:`pyggml.core.ops.Ops.op`."""

    def run(self):
        para = nodes.paragraph()
        for i, name in enumerate(_UNCHECKED):
            if i:
                para += nodes.Text(", ")
            para += nodes.literal(text=name)
        return [para]


# -- names pyggml re-exports (pyggml.Tensor is pyggml.core.tensor.Tensor, pyggml.dl is pyggml.raw.dl) --
def _lookup(name: str):
    """The object a dotted name reaches by import and attribute access, or None."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part, _MISSING)
            if obj is _MISSING:
                return None
        return obj
    return None


_MISSING = object()


def _resolve_reexport(app, env, node, contnode):
    """A Python cross-reference that found nothing: look the name up at run time (in the current
    class, module, then its packages outwards) and, if the object it reaches is documented under
    another name (``pyggml.Tensor`` is ``pyggml.core.tensor.Tensor``, ``OPS`` of ``pyggml.impl.numpy``
    is ``pyggml.impl.numpy.table.OPS``), link there."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip(".~")
    mod, cls = node.get("py:module"), node.get("py:class")
    candidates = [f"{mod}.{cls}.{target}"] if mod and cls else []
    parts = mod.split(".") if mod else []
    # the module, then its packages outwards
    candidates += [".".join(parts[:i] + [target]) for i in range(len(parts), 0, -1)]
    candidates.append(target)
    domain = env.get_domain("py")
    tail = "." + target.rsplit(".", 1)[-1]
    for name in candidates:
        if not name.startswith("pyggml"):
            continue
        obj = _lookup(name)
        if obj is None:
            continue
        for documented in domain.objects:
            if documented != name and documented.endswith(tail) and _lookup(documented) is obj:
                new = node.deepcopy()
                new["reftarget"] = documented
                found = domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"],
                                            documented, new, contnode)
                if found is not None:
                    return found
    return None


class UnlinkBuiltins(SphinxPostTransform):
    """Type annotations name builtins (``type[E]``, ``dict``): without intersphinx they link
    nowhere, and Sphinx's fuzzy search would otherwise link ``type`` to ``Tensor.type``."""

    default_priority = 5  # before sphinx's ReferencesResolver (10)

    def run(self, **kwargs):
        for node in list(self.document.findall(addnodes.pending_xref)):
            if (node.get("refdomain") == "py" and node.get("reftype") in ("class", "obj", "exc")
                    and node["reftarget"] in _BUILTINS):
                node.replace_self(node.children or [nodes.Text(node["reftarget"])])


_BUILTINS = frozenset(dir(builtins))


def _named_defaults(app, what, name, obj, options, signature, return_annotation):
    """Defaults that are faster-whisper's punctuation strings, by the name of their constant: a
    colon inside them makes Sphinx read the rest as a type (a dataclass's generated
    ``__init__`` has no source for ``autodoc_preserve_defaults`` to show)."""
    if signature:
        from pyggml.models.whisper import timing
        for const in ("APPEND_PUNCTUATIONS", "PREPEND_PUNCTUATIONS"):
            signature = signature.replace(repr(getattr(timing, const)), const)
    return signature, return_annotation


def setup(app):
    app.connect("autodoc-process-signature", _named_defaults)
    app.connect("autodoc-process-docstring", _napoleon)
    app.connect("autodoc-skip-member", _skip)
    app.add_directive("unchecked-ops", UncheckedOps)
    app.connect("missing-reference", _resolve_reexport)
    app.add_post_transform(UnlinkBuiltins)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
