"""arag.signatures"""
