"""The GGML_ASSERT audit (scripts/assert_audit.py, docs/asserts.md): every assert site of the
ggml pyggml builds is classified, the report is current, and the parser finds what grep finds.

When a ggml upgrade brings new assert sites (or moves one into another function), the first
test fails and names them: classify them in docs/asserts/classification.toml, then run
``python scripts/assert_audit.py`` to regenerate docs/asserts.md.
"""
from __future__ import annotations

import re
import sys

import pytest
from conftest import ROOT, assert_audit, ggml_tree

pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")

A = assert_audit()


@pytest.fixture(scope="module")
def src():
    """The source of the ggml pyggml was built with. The classification is of the default ggml
    (pyggml_build.pins.DEFAULT_VERSION): a build of another pinned ggml (scripts/check_variants.sh
    ggml-0.20.2) skips; a new default ggml runs and names its unclassified sites."""
    import pyggml
    pins = pytest.importorskip("pyggml_build.pins", reason="the build-time package of a source checkout")
    DEFAULT_VERSION = pins.DEFAULT_VERSION

    if pyggml.GGML_VERSION != DEFAULT_VERSION:
        pytest.skip(f"the assert audit classifies ggml {DEFAULT_VERSION}, this is ggml {pyggml.GGML_VERSION}")
    path = ggml_tree() / "src"
    if not (path / "ggml.c").is_file():
        pytest.skip(f"no ggml source at {path} (python build_ggml.py unpacks it)")
    return path


@pytest.fixture(scope="module")
def sites(src):
    return A.collect(src)


@pytest.fixture(scope="module")
def clf():
    if not (ROOT / "docs" / "asserts" / "classification.toml").is_file():
        pytest.skip("no docs/asserts beside tests/: the audit is tested in a source checkout")
    return A.Classifier(A.load_classification())


def test_every_assert_site_is_classified(sites, clf):
    problems = A.problems(sites, clf)
    assert not problems, "\n".join(problems[:60]) + (f"\n... {len(problems) - 60} more" if len(problems) > 60 else "")


def test_report_is_current(src, sites, clf):
    version = src.parent.name.removeprefix("ggml-")
    text = A.report(sites, clf, version)
    assert A.REPORT.read_text() == text, "docs/asserts.md is stale: run python scripts/assert_audit.py"


def test_every_gap_has_a_strict_xfail_test(clf):
    """Each open [[gap]] of the classification names a test of tests/test_assert_checks.py that
    is marked as a strict xfail (@gap(...)); each fixed one (status = "fixed") a plain test of
    that name, without the marker."""
    tests_src = (ROOT / "tests" / "test_assert_checks.py").read_text()
    assert clf.gaps
    for gid, g in clf.gaps.items():
        m = re.search(rf'@gap\("{gid} [^\n]*\n(?:[^\n]*\n)*?def {g["test"]}\(', tests_src)
        marked = bool(m and "def " not in m.group(0)[:-len(g["test"]) - 5])
        if clf.is_fixed(gid):
            assert re.search(rf"^def {g['test']}\(", tests_src, re.M), f"{gid}: no test {g['test']}"
            assert not marked, f"{gid} is fixed: {g['test']} must not be a strict xfail any more"
        else:
            assert marked, f"{gid}: no @gap-marked {g['test']}"
    assert "xfail(strict=True" in tests_src


def _grep_sites(text: str) -> int:
    """GGML_ASSERT/GGML_ABORT calls outside comments, counted without the parser."""
    no_comments = A._mask(text, strings=False)
    n = 0
    for m in re.finditer(r"\bGGML_(ASSERT|ABORT|ASSERT_ALIGNED)\s*\(", no_comments):
        line_start = no_comments.rfind("\n", 0, m.start()) + 1
        if no_comments[line_start:m.start()].lstrip().startswith("#define"):
            continue  # the definition line of GGML_ASSERT_ALIGNED itself
        n += 1
    return n


def test_parser_finds_every_site_grep_finds(src, sites):
    for rel, _tier in A.FILES:
        text = (src / rel).read_text(encoding="utf-8", errors="replace")
        assert sum(1 for s in sites if s.file == rel) == _grep_sites(text), rel
    assert not [s for s in sites if s.function == "<file scope>"], "a site outside any function"


def test_headers_the_parser_skips_have_no_asserts(src):
    """BLIND_SPOTS says these inline-function headers hold no GGML_ASSERT/GGML_ABORT."""
    for rel in ["ggml-cpu/vec.h", "ggml-cpu/simd-mappings.h", "ggml-cpu/common.h",
                "ggml-cpu/ggml-cpu-impl.h", "../include/ggml.h"]:
        path = src / rel
        if path.is_file():
            text = A._mask(path.read_text(encoding="utf-8", errors="replace"), strings=False)
            calls = [m for m in re.finditer(r"\bGGML_(ASSERT|ABORT)\s*\(", text)
                     if not text[text.rfind("\n", 0, m.start()) + 1:m.start()].lstrip().startswith("#")]
            assert not calls, f"{rel} has GGML_ASSERT/GGML_ABORT calls: add it to FILES"


def test_parser_on_tricky_c(tmp_path):
    """Function boundaries through #if/#else branches with unbalanced braces, constructors with
    initializer lists, macros, strings and comments holding braces, struct bodies."""
    code = r'''
    #define CHECK(x) GGML_ASSERT((x) > 0)
    struct s { int a; };  // { not a brace
    static const char * k = "}{";
    static int one(int x) {
    #ifdef A
        if (x) {
    #else
        if (!x) {
    #endif
            GGML_ASSERT(x != 1);
        }
        return 0;
    }
    struct kv {
        kv(const char * key, int v) : key(key), type(v) {
            GGML_ABORT("fatal %s", "}");
        }
        const char * key; int type;
    };
    template <typename T> static void two(T * p) noexcept {
        auto f = [](int y) { GGML_ASSERT(y); };
        /* GGML_ASSERT(commented) */
    }
    '''
    path = tmp_path / "t.cpp"
    path.write_text(code)
    found = [(s.function, s.kind, s.condition, s.pp) for s in A.parse(path, "t.cpp")[0]]
    assert found == [
        ("macro CHECK", "ASSERT", "(x) > 0", ()),
        ("one", "ASSERT", "x != 1", ()),
        ("kv", "ABORT", '"fatal %s", "}"', ()),
        ("two", "ASSERT", "y", ()),
    ]


def test_parameter_asserts_are_found_and_must_be_mapped(tmp_path):
    """op_parameters: an op constructor's non-tensor parameters and the locals computed from
    them (through an array too), not members of tensors (``a->type`` is no parameter ``type``),
    and nothing in a function that makes no node. problems() refuses a parameter assert that
    only a [[group]] classifies, or a [[site]] entry without a probe."""
    code = r'''
    struct ggml_tensor * ggml_thing(struct ggml_context * ctx, struct ggml_tensor * a, int s0, size_t offset) {
        GGML_ASSERT(a->type == GGML_TYPE_F32);
        GGML_ASSERT(offset < (size_t)(1 << 30));
        const int64_t OW = ggml_calc_conv_output_size(a->ne[0], 3, s0, 0, 1);
        int64_t ne[2] = { OW, a->ne[1] };
        GGML_ASSERT(ne[0] > 0);
        return a;
    }
    static void helper(struct ggml_context * ctx, int type) {
        GGML_ASSERT(type > 0);
    }
    '''
    path = tmp_path / "ggml.c"
    path.write_text(code)
    sites = A.parse(path, "ggml.c")[0]
    assert [(s.condition, s.params) for s in sites] == [
        ("a->type == GGML_TYPE_F32", ()),
        ("offset < (size_t)(1 << 30)", ("offset",)),
        ("ne[0] > 0", ("ne",)),
        ("type > 0", ()),
    ]
    group = {"file": "ggml.c", "class": "checked", "by": ["pyggml.core.ops.Ops.acc"], "why": "w",
             "functions": ["ggml_thing", "helper"]}
    site = {"file": "ggml.c", "function": "ggml_thing", "class": "checked", "why": "w",
            "by": ["pyggml.core.ops.Ops.acc"], "conditions": ["offset < (size_t)(1 << 30)", "ne[0] > 0"]}
    out = A.problems(sites, A.Classifier({"group": [group]}), check_refs=False)
    assert [p.split(":")[0] for p in out] == ["unmapped parameter assert"] * 2
    out = A.problems(sites, A.Classifier({"group": [group], "site": [site]}), check_refs=False)
    assert [p.split(":")[0] for p in out] == ["parameter assert without a probe"] * 2
    probed = dict(site, probes=["ctx.acc(...)", "ctx.acc(...)"])
    assert A.problems(sites, A.Classifier({"group": [group], "site": [probed]}), check_refs=False) == []
    wrong = dict(site, probes=["ctx.acc(...)"])
    assert "one probe per condition" in A.problems(sites, A.Classifier({"group": [group], "site": [wrong]}),
                                                   check_refs=False)[0]
