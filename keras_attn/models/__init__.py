"""Model builders: configs, presets and functional `keras.Model`s."""
