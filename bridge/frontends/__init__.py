"""Front-ends: each translates its wire protocol into the interception core's views and the
core's decisions back into its own bytes (stomp/, amqp/), and shares one check runner."""
