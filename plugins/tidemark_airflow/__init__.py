"""Tidemark's Airflow operators, hooks and sensors: thin wrappers over the `tidemark` package."""
