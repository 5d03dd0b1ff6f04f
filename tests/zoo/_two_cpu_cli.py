"""`keras-attn` on two logical CPU devices (TensorFlow), for the tests:
devices must be configured before TensorFlow starts."""

import sys

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

from keras_attn import cli  # noqa: E402

sys.exit(cli.main(sys.argv[1:]))
