"""ftc's control side: cluster spec, state, providers (local, aws, ssh, slurm) and the bootstrap."""
