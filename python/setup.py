"""The build hook of `pip install ./python` (the metadata is in pyproject.toml).

The package loads the stage libraries that `make lib` builds in the repository (build/lib), and
the package's files alone do not say where that is once they are copied into site-packages. So a
plain install records the checkout it was built from: flashcourse/_install.json, {"repo": "<the
checkout's absolute path>"}, which flashcourse/_library.py reads (_find_repo). An editable install
(`pip install -e python`) needs no record: the package stays in the checkout and finds it there.
A package built from a copy that is not inside a checkout records nothing, and neither does one
built in a folder pip deletes afterwards (`pip install git+URL#subdirectory=python` clones into a
temporary pip-req-build-* folder): either says at the first call that FLASHCOURSE_LIB_DIR names
the libraries' folder, or to install from a checkout.

setuptools' scratch files (build/, flashcourse.egg-info/) go to a temporary folder that is removed
afterwards, so an install leaves the checkout as it was.
"""

import atexit
import json
import os
import shutil
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
# the folders pip builds a requirement in and removes afterwards (a VCS URL, an archive)
PIP_SCRATCH = ("pip-req-build-", "pip-install-", "pip-build-")
REPO = os.path.dirname(HERE)
SCRATCH = tempfile.mkdtemp(prefix="flashcourse-build-")
atexit.register(shutil.rmtree, SCRATCH, True)


class build_py_with_repo(build_py):
    """build_py, plus flashcourse/_install.json naming the checkout (not for editable installs)."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        if not os.path.isfile(os.path.join(REPO, "common", "attention.h")):
            return  # not built inside a checkout: nothing true to record
        if any(part.startswith(PIP_SCRATCH) for part in REPO.split(os.sep)):
            return  # pip's own scratch copy, deleted once installed: recording it would lie
        path = os.path.join(self.build_lib, "flashcourse", "_install.json")
        with open(path, "w") as f:
            json.dump({"repo": REPO}, f)
            f.write("\n")


setup(
    cmdclass={"build_py": build_py_with_repo},
    options={
        "build": {"build_base": os.path.join(SCRATCH, "build")},
        "egg_info": {"egg_base": SCRATCH},
    },
)
