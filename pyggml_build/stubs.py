"""Typing outputs of step 4: what type checkers and editors know about the raw and the op layer,
generated from the same parsed declarations the extension is compiled from (cffi's parser, on
pycparser), never written by hand.

- :func:`lib_stub_source` writes ``pyggml/_ggml.pyi``, the stub of the cffi extension next to
  it: ``lib`` with every function of the headers (C types as Python types: :func:`py_type`),
  every integer constant and enum value, and the ``extern "Python"`` trampolines; ``ffi`` with
  the methods of cffi's FFI object; ``CData``, the type of every C pointer and struct.
- :func:`ops_source` writes ``pyggml/core/_unchecked_ops.py``: a real method for each op constructor
  of the headers that has no checked method of its own in ``pyggml/core/ops.py`` (found by reading
  that file: :func:`hand_written_ops`), with the C parameters' names and types and the header's
  own declaration and comments as its docstring. :class:`pyggml.core.ops.Ops` inherits them.

The inputs are the declarations cffi parsed (:func:`c_declarations`: types, with typedefs
resolved) and, for the names cffi does not keep, :class:`Function` rows made by
:func:`pyggml_build.declarations.function_info` from pycparser's tree of the same text.
"""
from __future__ import annotations

import ast
import keyword
from dataclasses import dataclass, field
from pathlib import Path

from cffi import model

__all__ = ["Function", "c_declarations", "py_type", "python_names", "lib_stub_source",
           "op_constructor_names", "hand_written_ops", "ops_source"]


@dataclass
class Function:
    """What the headers say about one function besides its types."""
    header: str                       #: the header that declares it ("pyggml" for pyggml's own helpers)
    params: list[str | None]          #: parameter names as in C (None for an unnamed one)
    prototype: str                    #: the C prototype, one line
    source: str = ""                  #: the header's own declaration text, comments included
    comment: list[str] = field(default_factory=list)  #: the ``//`` lines just above it


def c_declarations(ffibuilder) -> dict[str, tuple[model.BaseTypeByIdentity, int]]:
    """``{"function NAME" | "macro NAME" | "constant NAME" | "enum NAME" | ...: (type, quals)}``:
    what cffi's parser read from the cdef (the table cffi's own code generator works from)."""
    return ffibuilder._parser._declarations


def py_type(t: model.BaseTypeByIdentity, *, arg: bool) -> str:
    """The Python type cffi takes (``arg``) or gives for the C type ``t``: integers and enums
    ``int``, floating point ``float``, ``_Bool`` ``bool``, pointers and structs ``CData`` (the
    ``ffi.NULL`` constant included; never None). As arguments, ``char *`` and ``void *`` also
    take ``bytes``, pointers to numbers a list or tuple (a temporary C array), structs a dict
    or sequence of their fields."""
    if isinstance(t, model.VoidType):
        return "None"
    if isinstance(t, model.PrimitiveType):
        if t.name == "_Bool":
            return "bool"
        if t.is_float_type():
            return "float"
        if t.is_char_type():
            return "bytes"
        return "int"
    if isinstance(t, (model.EnumType, model.UnknownIntegerType)):
        return "int"
    if isinstance(t, model.UnknownFloatType):
        return "float"
    if isinstance(t, (model.PointerType, model.ArrayType)):
        item = t.totype if isinstance(t, model.PointerType) else t.item
        if arg and (isinstance(item, model.VoidType)
                    or isinstance(item, model.PrimitiveType) and item.is_char_type()):
            return "CData | bytes"
        if arg and isinstance(item, (model.PrimitiveType, model.EnumType)):
            return f"CData | Sequence[{py_type(item, arg=True)}]"
        return "CData"
    if isinstance(t, model.StructOrUnion):
        return "CData | Mapping[str, Any] | Sequence[Any]" if arg else "CData"
    if isinstance(t, model.BaseFunctionType):
        return "CData"
    raise TypeError(f"no Python type for the C type {t!r}")


def python_names(names: list[str | None], taken: tuple[str, ...] = ()) -> list[str]:
    """C parameter names as Python identifiers: ``a<i>`` for an unnamed one, ``_`` appended to a
    keyword or to a name in ``taken``."""
    out = []
    for i, n in enumerate(names):
        n = n or f"a{i}"
        while keyword.iskeyword(n) or n in taken or n in out:
            n += "_"
        out.append(n)
    return out


def _docstring(text: str, indent: str) -> str:
    text = text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    lines = text.strip("\n").split("\n")
    body = "\n".join((indent + ln).rstrip() for ln in lines[1:])
    return f'{indent}"""{lines[0]}' + (f"\n{body}\n{indent}" if len(lines) > 1 else "") + '"""'


def _header_text(name: str, info: Function | None) -> str:
    """The declaration as the header has it (with its comments), else the one-line prototype."""
    if info is None:
        return ""
    src = "\n".join(info.comment + [info.source or info.prototype])
    return f"Declared in {info.header}::\n\n" + "\n".join("    " + ln for ln in src.split("\n"))


def _signature(names: list[str], types: list[str], ellipsis: bool, *, self_: bool,
               positional_only: bool) -> str:
    params = (["self"] if self_ else []) + [f"{n}: {t}" for n, t in zip(names, types)]
    if positional_only and (names or self_):
        params.append("/")
    if ellipsis:
        params.append("*args: Any")
    return ", ".join(params)


_CDATA_STUB = '''\
class CData:
    """A C object as cffi gives it (``<cdata 'struct ggml_tensor *'>``): a pointer, a struct, an
    array or a number cast to a C type. Fields, items, arithmetic and comparisons are C's; at
    run time this class is ``ffi.CData``."""
    def __getattr__(self, name: str) -> Any: ...
    def __setattr__(self, name: str, value: Any) -> None: ...
    def __getitem__(self, index: Any) -> Any: ...
    def __setitem__(self, index: Any, value: Any) -> None: ...
    def __add__(self, other: int) -> CData: ...
    def __sub__(self, other: Any) -> Any: ...
    def __call__(self, *args: Any) -> Any: ...
    def __eq__(self, other: object) -> bool: ...
    def __ne__(self, other: object) -> bool: ...
    def __lt__(self, other: CData) -> bool: ...
    def __le__(self, other: CData) -> bool: ...
    def __gt__(self, other: CData) -> bool: ...
    def __ge__(self, other: CData) -> bool: ...
    def __hash__(self) -> int: ...
    def __bool__(self) -> bool: ...
    def __int__(self) -> int: ...
    def __float__(self) -> float: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[Any]: ...
    def __enter__(self) -> CData: ...
    def __exit__(self, *exc: object) -> None: ...


class CType:
    """A C type (``ffi.typeof``)."""
    kind: str
    cname: str
    item: CType
    length: int | None
    args: tuple[CType, ...]
    result: CType
    ellipsis: bool
    abi: int
    fields: list[tuple[str, Any]]
    elements: dict[int, str]
    relements: dict[str, int]


_F = TypeVar("_F", bound=Callable[..., Any])
_CData: TypeAlias = CData
_CType: TypeAlias = CType


class FFI:
    """cffi's ``FFI`` object of the extension (``ffi``): the methods pyggml and its users call."""
    NULL: _CData
    CData: type[_CData]
    CType: type[_CType]
    errno: int
    def cast(self, cdecl: str | _CType, source: Any, /) -> _CData: ...
    def new(self, cdecl: str | _CType, init: Any = ..., /) -> _CData: ...
    def new_allocator(self, alloc: Callable[[int], _CData] | None = ..., free: Callable[[_CData], None] | None = ...,
                      should_clear_after_alloc: bool = ...) -> Callable[..., _CData]: ...
    def string(self, cdata: _CData, maxlen: int = ..., /) -> bytes: ...
    def unpack(self, cdata: _CData, length: int, /) -> Any: ...
    def buffer(self, cdata: _CData, size: int = ..., /) -> Any: ...
    def from_buffer(self, cdecl: Any, python_buffer: Any = ..., /, require_writable: bool = ...) -> _CData: ...
    def memmove(self, dest: Any, src: Any, n: int) -> None: ...
    def typeof(self, cdecl: str | _CData | Callable[..., Any], /) -> _CType: ...
    def sizeof(self, cdecl: str | _CType | _CData, /) -> int: ...
    def alignof(self, cdecl: str | _CType | _CData, /) -> int: ...
    def offsetof(self, cdecl: str | _CType, *fields: str | int) -> int: ...
    def addressof(self, cdata: _CData | Lib, *fields: str | int) -> _CData: ...
    def getctype(self, cdecl: str | _CType, replace_with: str = ...) -> str: ...
    def gc(self, cdata: _CData, destructor: Callable[[_CData], Any] | None, size: int = ...) -> _CData: ...
    def new_handle(self, x: object, /) -> _CData: ...
    def from_handle(self, x: _CData, /) -> Any: ...
    def release(self, x: _CData, /) -> None: ...
    def callback(self, cdecl: str | _CType, python_callable: Callable[..., Any] | None = ...,
                 error: Any = ..., onerror: Callable[..., Any] | None = ...) -> Any: ...
    def def_extern(self, name: str = ..., error: Any = ...,
                   onerror: Callable[..., Any] | None = ...) -> Callable[[_F], _F]: ...
    def init_once(self, func: Callable[[], Any], tag: Any) -> Any: ...
    def integer_const(self, name: str) -> int: ...
    def list_types(self) -> tuple[list[str], list[str], list[str]]: ...
'''


def _enum_constants(decls: dict) -> list[tuple[str, str]]:
    out = []
    for key, (t, _q) in decls.items():
        if isinstance(t, model.EnumType) and key.startswith(("enum ", "anonymous ")):
            for name, value in zip(t.enumerators, t.enumvalues):
                out.append((name, f"int  # {t.name} = {value}"))
    return out


def lib_stub_source(ffibuilder, functions: dict[str, Function], version: str) -> str:
    """The text of ``pyggml/_ggml.pyi``: ``ffi`` and ``lib`` of the extension, every function
    with its C signature in Python types and the header's declaration as its docstring."""
    decls = c_declarations(ffibuilder)
    consts: list[tuple[str, str]] = []
    funcs: list[str] = []
    for key, (t, _q) in sorted(decls.items()):
        kind, _, name = key.partition(" ")
        if kind == "macro":
            consts.append((name, "int"))
        elif kind in ("constant", "variable"):
            consts.append((name, py_type(t, arg=False)))
        elif kind == "extern_python":
            consts.append((name, 'CData  # extern "Python" trampoline (pyggml.raw.callbacks)'))
        elif kind == "function":
            info = functions.get(name)
            names = python_names(info.params if info and len(info.params) == len(t.args)
                                 else [None] * len(t.args), ("self",))
            sig = _signature(names, [py_type(a, arg=True) for a in t.args], t.ellipsis,
                             self_=True, positional_only=True)
            doc = _header_text(name, info) or f"{name}: {t}"
            funcs.append(f"    def {name}({sig}) -> {py_type(t.result, arg=False)}:\n"
                         f"{_docstring(doc, '        ')}\n")
    consts += _enum_constants(decls)
    consts.sort()
    lines = [f'"""Generated by pyggml_build/stubs.py from the headers of ggml {version}: do not edit.',
             "",
             "The types of the cffi extension ``pyggml._ggml`` (``pyggml.raw.ffi``, ``pyggml.raw.lib``).",
             "Parameters are positional only, as cffi calls them.",
             '"""',
             "from collections.abc import Callable, Iterator, Mapping, Sequence",
             "from typing import Any, TypeAlias, TypeVar",
             "", "", _CDATA_STUB, "",
             "class Lib:",
             '    """Every function, enum value and constant of the headers, under its C name."""']
    lines += [f"    {name}: {typ}" for name, typ in consts]
    lines.append("")
    lines += funcs
    lines += ["", "ffi: FFI", "lib: Lib", ""]
    return "\n".join(lines)


#: functions of the op constructors' signature that make no node (as pyggml.core.ops)
CONTEXT_LOOKUPS = frozenset({"ggml_get_tensor", "ggml_get_first_tensor", "ggml_get_next_tensor"})


def op_constructor_names(ffibuilder) -> list[str]:
    """The op constructors of the headers without ``ggml_``, as :func:`pyggml.core.ops.op_constructors`
    finds them at run time: ``struct ggml_tensor * ggml_<name>(struct ggml_context *, ...)``,
    less ``ggml_new_*``, ``ggml_graph_*`` and the context's tensor look-ups."""
    out = []
    for key, (t, _q) in c_declarations(ffibuilder).items():
        kind, _, name = key.partition(" ")
        if (kind != "function" or not name.startswith("ggml_")
                or name.startswith(("ggml_new_", "ggml_graph_")) or name in CONTEXT_LOOKUPS
                or not t.args):
            continue
        if t.result.get_c_name() == "struct ggml_tensor *" and t.args[0].get_c_name() == "struct ggml_context *":
            out.append(name[5:])
    return sorted(out)


def hand_written_ops(ops_py: Path) -> set[str]:
    """Names defined in the body of ``class Ops`` in ``ops_py`` (methods and assignments): the
    ops with a method of their own, which :func:`ops_source` leaves out."""
    tree = ast.parse(ops_py.read_text(), str(ops_py))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Ops":
            names = set()
            for stmt in node.body:
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(stmt.name)
                elif isinstance(stmt, ast.Assign):
                    names.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
                elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    names.add(stmt.target.id)
            return names
    raise RuntimeError(f"no class Ops in {ops_py}")


def _op_type(t: model.BaseTypeByIdentity) -> str:
    if t.get_c_name() in ("struct ggml_tensor *", "struct ggml_tensor const *"):
        return "Tensor"
    return py_type(t, arg=True)


def ops_source(ffibuilder, functions: dict[str, Function], hand_written: set[str], version: str) -> str:
    """The text of ``pyggml/core/_unchecked_ops.py``: class ``UncheckedOps`` with one method per op
    constructor not in ``hand_written``, ``ctx.<name>(...)`` = ``ctx.op("<name>", ...)``."""
    decls = c_declarations(ffibuilder)
    names = [n for n in op_constructor_names(ffibuilder) if n not in hand_written]
    methods = []
    for name in names:
        t = decls[f"function ggml_{name}"][0]
        info = functions.get(f"ggml_{name}")
        args = t.args[1:]
        cnames = info.params[1:] if info and len(info.params) == len(t.args) else [None] * len(args)
        pnames = python_names(cnames, ("self", "Tensor", "CData", "Any", "Sequence", "Mapping"))
        sig = _signature(pnames, [_op_type(a) for a in args], t.ellipsis, self_=True,
                         positional_only=False)
        doc = (f"``ggml_{name}``, not checked by pyggml: the call is tried in a forked copy of the\n"
               "process first, and ValueError carries ggml's message if it would abort\n"
               "(:meth:`~pyggml.core.ops.Ops.op`). Tensors are passed as their pointers.\n\n"
               + (_header_text(name, info) + "\n" if info else ""))
        call = ", ".join([repr(name)] + pnames + (["*args"] if t.ellipsis else []))
        methods.append(f"    def {name}({sig}) -> Tensor:\n{_docstring(doc, '        ')}\n"
                       f"        return self.op({call})\n")
    listing = "".join(f"    {n!r},\n" for n in names)
    return (f'"""Generated by pyggml_build/stubs.py from the headers of ggml {version}: do not edit.\n\n'
            "The op constructors of the headers that have no checked method in :mod:`pyggml.core.ops`, as\n"
            "methods of :class:`pyggml.core.ops.Ops` (which inherits this class), with their C parameters.\n"
            '"""\n'
            "from __future__ import annotations\n\n"
            "from collections.abc import Mapping, Sequence\n"
            "from typing import TYPE_CHECKING, Any\n\n"
            "if TYPE_CHECKING:\n"
            "    from ..raw import CData\n"
            "    from .tensor import Tensor\n\n"
            '__all__ = ["UncheckedOps", "UNCHECKED_OPS"]\n\n'
            f"#: the methods of :class:`UncheckedOps`\nUNCHECKED_OPS = frozenset({{\n{listing}}})\n\n\n"
            "class UncheckedOps:\n"
            '    """The unchecked op constructors (a mixin of :class:`pyggml.core.ops.Ops`)."""\n\n'
            "    if TYPE_CHECKING:\n"
            "        def op(self, name: str, *args: Any) -> Tensor: ...\n\n"
            + "\n".join(methods))
