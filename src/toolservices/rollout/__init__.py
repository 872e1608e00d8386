"""Rollouts against any OpenAI-compatible chat endpoint (vLLM, SGLang, OpenAI...).

:class:`Rollout` runs many tool-using episodes at once with the official
``openai`` SDK (``pip install 'toolservices[rollout]'``): tool specs go out as
``tools=``, calls come back parsed by the server or are parsed here from the
raw text, and each episode yields a :class:`Trajectory` (messages, tool
results, metrics, finish reason, token ids and log-probabilities when the
server returns them). :mod:`toolservices.rollout.testing` has a scripted
loopback server for tests.
"""

from toolservices.rollout._request import RetryPolicy
from toolservices.rollout._runner import Rollout, rollout
from toolservices.rollout._trajectory import Trajectory, TurnRecord

__all__ = ["RetryPolicy", "Rollout", "Trajectory", "TurnRecord", "rollout"]
