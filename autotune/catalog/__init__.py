"""What the hardware and models are: the GPU and model catalogs and GPU prices, read by
the simulator and by everything above it."""
