"""pipelines/runners"""
