"""Host utilities below both the agent and the runtime: core binding, CPU priority, thread walks."""
