# The release, as MCP's serverInfo.version reports it (the REST API's own version is /api/v1/'s "1").
__version__ = "0.3.0"
