"""The node agent: starts and stops the worker processes of this node."""
