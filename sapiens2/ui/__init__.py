"""The only Gradio-facing part of the package: components and checks the app builds its UI from."""
