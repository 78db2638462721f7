"""The bundled example model repository and the script that builds its weights."""
