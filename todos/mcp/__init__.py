"""MCP tools for agents (todos/mcp/server.py is the endpoint, tools.py the tools)."""
