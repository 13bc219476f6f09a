"""Lazy dataset transforms: each wraps one or more datasets and computes its items on
demand, without copying data."""
