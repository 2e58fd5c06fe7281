"""Signatures that write retrieval queries: follow-up questions, keyword rewrites, sub-questions."""
