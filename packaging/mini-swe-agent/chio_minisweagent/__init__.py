"""mini-swe-agent environments backed by chio.

- `ChioEnvironment`: every command in a fresh chio cage over the agent's working directory.
- `ChioRepositoryEnvironment`: every command through chio's repository execution leg (a signed
  transition per command, a verified patch at the end).

Use them from a mini-swe-agent config by dotted path:

    environment:
      environment_class: chio_minisweagent.ChioEnvironment
"""

from chio_minisweagent.cage import ChioEnvironment, ChioEnvironmentConfig
from chio_minisweagent.repository import ChioRepositoryEnvironment, ChioRepositoryEnvironmentConfig

__all__ = [
    "ChioEnvironment",
    "ChioEnvironmentConfig",
    "ChioRepositoryEnvironment",
    "ChioRepositoryEnvironmentConfig",
]
