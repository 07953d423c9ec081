"""Gluon (sm_90) attention kernels: seesaw (64-row tiles), narrow (16/32), and their shared helpers."""
