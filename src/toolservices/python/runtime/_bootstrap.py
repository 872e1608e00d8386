"""Make a runtime entry module started by path part of the runtime package.

``python -s .../runtime/_forkserver.py`` runs the file as ``__main__`` with
the runtime directory first on ``sys.path`` and no package, so its relative
imports would fail. Each entry module puts its directory first on
``sys.path`` (``-I`` leaves it off) and imports this one; it registers the directory as the package
``_toolservices_runtime``, makes ``__main__`` a member of it, and takes the
directory off ``sys.path`` again: user code in a session must not see the
runtime's private modules as top-level names. No ``importlib.util``: it
costs milliseconds of start-up, which the launcher pays on every launch.
"""

import os
import sys

PACKAGE = "_toolservices_runtime"


def _install() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    if PACKAGE not in sys.modules:
        init = os.path.join(here, "__init__.py")
        package = type(sys)(PACKAGE)
        package.__path__ = [here]
        package.__package__ = PACKAGE
        package.__file__ = init
        sys.modules[PACKAGE] = package
        with open(init, encoding="utf-8") as fh:
            exec(compile(fh.read(), init, "exec"), package.__dict__)
    sys.modules["__main__"].__package__ = PACKAGE
    while here in sys.path:
        sys.path.remove(here)


_install()
