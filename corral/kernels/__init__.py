"""Fast paths kept apart from the readable code they replace (see each module)."""
