// placeholder so the library links before the kernels land (removed by the kernels change)
