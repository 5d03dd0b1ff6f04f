"""`keras-attn` on two logical CPU devices (TensorFlow), for the tests:
devices must be configured before TensorFlow starts."""

import sys


def main():
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2
    )
    import keras_attn.cli as cli

    return cli.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
