"""arag.programs"""
