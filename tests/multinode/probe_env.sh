#!/bin/sh
# Stands in for gmod under launch/run_multi_node.sh in test_forward_env.sh: one line per rank with its host and the
# NCCL_*, CUDA_*, GMOD_*, PYTORCH_*, ATEN_*, ONEDNN_* and MN_UNFORWARDED variables it was started with (written at once: the ranks'
# lines must not interleave).
vars=$(env | grep -E '^(NCCL|CUDA|GMOD|PYTORCH|ATEN|ONEDNN)_|^MN_UNFORWARDED=' | sort | tr '\n' ' ')
printf '%s rank %s: %s\n' "$(hostname)" "${OMPI_COMM_WORLD_RANK:-?}" "$vars"
