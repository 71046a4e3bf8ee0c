"""Pure rules of event routing: values and decisions, no I/O."""
