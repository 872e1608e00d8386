"""A code judge: SandboxFusion's HTTP API (``toolservices serve --sandbox-fusion``) and
:class:`CodeJudge` in Python, each submission in a fresh sandboxed session.

See docs/code-judge.md.
"""

from toolservices.judge._compare import outputs_match
from toolservices.judge._judge import CodeJudge
from toolservices.judge._languages import LANGUAGES


def serve_judge(**kwargs: object) -> int:
    """``toolservices serve --sandbox-fusion`` (needs the ``judge`` extra: starlette, uvicorn)."""
    from toolservices.judge._server import serve_judge as serve

    return serve(**kwargs)  # type: ignore[arg-type]


__all__ = ["LANGUAGES", "CodeJudge", "outputs_match", "serve_judge"]
