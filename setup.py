"""setuptools glue: ``build_ext`` runs build_ggml.py (CMake + cffi) into the wheel's package folder."""
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_ggml  # noqa: E402


class BuildGGML(build_ext):
    def run(self):
        pkg = Path(build_ggml.ROOT / "pyggml" if self.inplace else Path(self.build_lib) / "pyggml")
        try:
            build_ggml.build(pkg)
        except build_ggml.BuildError as e:
            raise SystemExit(f"build_ggml: error: {e}") from None

    def get_outputs(self):  # the files are written by build_ggml, not by distutils
        return []


setup(
    # a placeholder: its real content (and libggml*.so) is produced by BuildGGML
    ext_modules=[Extension("pyggml._ggml", sources=[])],
    cmdclass={"build_ext": BuildGGML},
)
