"""A code judge: SandboxFusion's HTTP API (``toolservices serve --sandbox-fusion``) and
:class:`CodeJudge` in Python, each submission in a fresh sandboxed session.

See docs/code-judge.md.
"""

from toolservices.judge._compare import outputs_match
from toolservices.judge._judge import CodeJudge
from toolservices.judge._languages import LANGUAGES

__all__ = ["LANGUAGES", "CodeJudge", "outputs_match"]
