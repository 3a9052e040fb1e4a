"""Multi-stage pipelines: deploy files, payloads, connectors, stages and the orchestrator."""
