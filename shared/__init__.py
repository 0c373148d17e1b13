"""What every service shares: the wire protocol, configuration, Redis key names, logging."""
