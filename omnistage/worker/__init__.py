"""Model runner side of a stage: persistent input batch, attention metadata, forward, sampling."""
