"""The services of HPC-DS1, one package each; `hpc_ds1.process.runtime` runs them."""
