"""pipelines/runners/kfp"""
