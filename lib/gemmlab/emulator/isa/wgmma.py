"""WGMMA (sm_90a): warpgroup-wide asynchronous MMAs from shared-memory descriptors."""
