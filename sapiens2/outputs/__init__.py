"""What goes out: pictures, files and formats, meshes, encoders (PNG, PLY, GLB), writers."""
