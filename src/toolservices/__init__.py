"""toolservices."""
