"""components/jobs/tfjob"""
