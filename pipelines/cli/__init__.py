"""pipelines/cli"""
