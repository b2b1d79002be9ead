"""Operations: config, logging, metrics, workers, systemd notify, signing keys."""
