"""arag.optimizers"""
