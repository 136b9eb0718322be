"""Every bound the service enforces, in one place (issue 34).

Serializers, the queue service, MCP schemas and the API descriptions read these names; none restates a
number. A bound an operator may tune reads its setting here (settings.py documents the variable), so the
rest of the code never reaches into settings for a limit.
"""

from __future__ import annotations
