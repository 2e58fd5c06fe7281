"""arag.data"""
