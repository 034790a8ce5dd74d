"""pipelines/runners/local"""
