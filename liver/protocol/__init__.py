"""The contract between the controller and its workers: neither side owns it, both import it."""
