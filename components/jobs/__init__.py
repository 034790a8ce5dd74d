"""components/jobs"""
