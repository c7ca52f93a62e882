"""One ConfigurableResource per external system, each with a real local implementation."""
