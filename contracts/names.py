"""What a node name and a job id may be: names are names (issue #49).

A sample's ``node`` ends up in ``scontrol update NodeName=…`` and in the Kubernetes
API path ``/api/v1/nodes/<node>``. Slurm expands host lists (``gpu-[01-04]``,
``a,b``) and knows ``ALL``, so a name that is not one host name can act on many
machines, and a ``/`` or ``..`` can reach another API object. So:

- ``node`` is an RFC 1123 host name: dot-separated labels of ASCII letters, digits
  and ``-``, each 1-63 characters, not starting or ending with ``-``; 253 characters
  at most; no trailing dot. Upper case is accepted and kept as sent (RFC 1123 host
  names are case-insensitive, but Slurm's node names are case-sensitive, so Vigil
  does not fold them); the Kubernetes executor, whose node names are lower case,
  refuses upper case itself. The words Slurm reads as "every node" (``all``,
  ``default``, any case) are refused.
- ``job`` is ``""`` (no job) or 1-256 characters of ``A-Z a-z 0-9 . _ : / + @ -``
  starting with a letter or digit: Slurm ids (``1234``, array ``1234_7``,
  heterogeneous ``1234+0``), Kubernetes ``namespace/name``, and the simulator's,
  the demo's and the foreign traces' names all fit. No whitespace, no braces (Redis
  keys carry the job in a ``{…}`` hash tag), no glob or host-list characters, no
  leading ``-`` (a job id may be an argument of a site's command).

Standard library only: the node agent, the worker and the executors use the same
patterns.
"""

from __future__ import annotations

import re

MAX_NODE_CHARS = 253
MAX_JOB_CHARS = 256
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
# one pattern, usable by ``re`` and by msgspec's ``Meta(pattern=…)`` (a search)
NODE_PATTERN = (rf"\A(?!(?i:all|default)\Z)(?=[^\n]{{1,{MAX_NODE_CHARS}}}\Z)"
                rf"{_LABEL}(?:\.{_LABEL})*\Z")
JOB_PATTERN = rf"\A(?:[A-Za-z0-9][A-Za-z0-9._:/+@-]{{0,{MAX_JOB_CHARS - 1}}})?\Z"
# the same, without anchors or look-arounds, for JSON Schema (ECMA 262) consumers
NODE_SCHEMA_PATTERN = rf"^{_LABEL}(\.{_LABEL})*$"
JOB_SCHEMA_PATTERN = rf"^([A-Za-z0-9][A-Za-z0-9._:/+@-]{{0,{MAX_JOB_CHARS - 1}}})?$"
SLURM_RESERVED = ("all", "default")

_NODE = re.compile(NODE_PATTERN)
_JOB = re.compile(JOB_PATTERN)


def node_problem(name: object) -> str | None:
    """Why ``name`` is not a node name (a sentence), or None when it is one."""
    if not isinstance(name, str):
        return "must be a string"
    if _NODE.match(name):
        return None
    if not name:
        return "is empty"
    if len(name) > MAX_NODE_CHARS:
        return f"is {len(name)} characters, over {MAX_NODE_CHARS}"
    if name.lower() in SLURM_RESERVED:
        return f"{name!r} is a word Slurm reads as every node"
    bad = sorted({c for c in name if not (c.isascii() and (c.isalnum() or c in "-."))})
    if bad:
        return f"{_short(name)} has character(s) {''.join(bad)!r}: an RFC 1123 host name " \
               "has letters, digits, '-' and '.' only"
    return f"{_short(name)} is not an RFC 1123 host name (a label empty, over 63 " \
           "characters, or starting or ending with '-')"


def job_problem(job: object) -> str | None:
    """Why ``job`` is not a job id (a sentence), or None when it is one (``""`` is)."""
    if not isinstance(job, str):
        return "must be a string"
    if _JOB.match(job):
        return None
    if len(job) > MAX_JOB_CHARS:
        return f"is {len(job)} characters, over {MAX_JOB_CHARS}"
    return f"{_short(job)} is not a job id: letters, digits and . _ : / + @ - only, " \
           "starting with a letter or digit"


def is_node_name(name: object) -> bool:
    """True for an RFC 1123 host name Vigil accepts as a node."""
    return isinstance(name, str) and _NODE.match(name) is not None


def _short(value: str) -> str:
    return repr(value if len(value) <= 80 else value[:77] + "...")
