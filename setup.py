"""setuptools glue: ``build_ext`` runs the build of ``pyggml_build`` (CMake + cffi) into the
wheel's package folder."""
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pyggml_build  # noqa: E402  (build-time package next to this file, not installed)


class BuildGGML(build_ext):
    def run(self):
        pkg = Path(pyggml_build.ROOT / "pyggml" if self.inplace else Path(self.build_lib).absolute() / "pyggml")
        try:
            files = pyggml_build.build(pkg)
        except pyggml_build.BuildError as e:
            raise SystemExit(f"build_ggml: error: {e}") from None
        pyggml_build.mirror(files, pkg)  # the clone's own pyggml/ works too (python -m pyggml)

    def get_outputs(self):  # the files are written by pyggml_build, not by distutils
        return []


setup(
    # a placeholder: its real content (and libggml*.so) is produced by BuildGGML
    ext_modules=[Extension("pyggml._ggml", sources=[])],
    cmdclass={"build_ext": BuildGGML},
)
