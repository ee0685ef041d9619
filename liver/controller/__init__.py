"""The controller: events in, generations out (DESIGN.md, "Events and the controller")."""
