"""Speculative decoding's host side: proposers that draft tokens from a request's own tokens
(ngram.py, suffix.py), the adaptive draft length (adaptive.py) and
whether speculation pays at the current load (governor.py), and the Speculator
the scheduler asks (speculator.py). The device side, verifying drafts, is sample/rejection.py."""
