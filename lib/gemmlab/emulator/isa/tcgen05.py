"""tcgen05 (sm_100a): tensor memory and the fifth-generation tensor core MMAs."""
