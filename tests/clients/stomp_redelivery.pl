#!/usr/bin/perl
# A consumer from outside the Python ecosystem that fails a message over and over: Perl's
# Net::Stomp (Debian libnet-stomp-perl), to see the bridge's redelivery policy from there.
#
#   stomp_redelivery.pl HOST PORT USER PASS VHOST DESTINATION VERSION MODE ACKAFTER [EXPECT]
#
# Sends one message to DESTINATION, then consumes it with ack:client-individual (ack:client on
# STOMP 1.0) and fails each delivery, until a delivery has JMSXDeliveryCount ACKAFTER (then it is
# ACKed) or no delivery comes for 5 s (the policy moved or deleted it); until EXPECT deliveries
# have come, it waits up to 20 s for the next one (a busy machine delays a redelivery). MODE says
# how a delivery fails: "nack" (STOMP 1.1/1.2) or "disconnect" (the connection is closed with the
# delivery unacknowledged; a new connection subscribes again). Prints one line of JSON: every
# delivery's JMSXDeliveryCount and the ms between the failure and the next delivery; exits 0 when
# the run itself worked (what the bridge did is for the caller to judge). Bounded by 60 seconds.
use strict;
use warnings;

use JSON::PP ();
use Net::Stomp ();
use Time::HiRes qw(time);

my $TOTAL_SECONDS = 60;
my $QUIET_SECONDS = 5;
my $EXPECTED_SECONDS = 20;    # a redelivery 250 ms out came after over 5 s beside the suite
my $started = time;
my %summary = (client => "perl $^V Net::Stomp $Net::Stomp::VERSION", counts => [], gaps_ms => []);

sub finish {
    my ($ok, $error) = @_;
    $summary{ok} = $ok ? JSON::PP::true : JSON::PP::false;
    $summary{error} = $error if defined $error;
    print JSON::PP->new->canonical->encode(\%summary), "\n";
    exit($ok ? 0 : 1);
}

sub fail {
    my ($msg) = @_;
    $msg =~ s/ at \S+ line \d+\.?//g;
    $msg =~ s/\s+\z//;
    finish(0, $msg);
}

$SIG{ALRM} = sub { fail("timed out after $TOTAL_SECONDS s") };
alarm($TOTAL_SECONDS);
{
    no warnings 'redefine';
    *Net::Stomp::_reconnect = sub { die "connection to the server was lost\n" };
}

@ARGV == 9 || @ARGV == 10
    or fail('usage: stomp_redelivery.pl HOST PORT USER PASS VHOST DESTINATION VERSION '
            . 'MODE ACKAFTER [EXPECT]');
my ($host, $port, $user, $pass, $vhost, $destination, $version, $mode, $ack_after, $expect)
    = @ARGV;
$expect //= 0;
$mode =~ /\A(nack|disconnect)\z/ or fail("MODE must be nack or disconnect, not '$mode'");
$mode eq 'disconnect' || $version ne '1.0' or fail('STOMP 1.0 has no NACK');
my $run = sprintf('%x-%x', $$, int($started * 1000));
my $sub_id = "perl-$run";

sub open_subscribed {
    my $stomp = eval {
        Net::Stomp->new({ hostname => $host, port => $port, timeout => 5,
                          initial_reconnect_attempts => 1, reconnect_attempts => 1,
                          connect_delay => 0 });
    } or fail("cannot connect to $host:$port: " . ($@ || 'unknown error'));
    my $reply = eval {
        $stomp->connect({ login => $user, passcode => $pass, host => $vhost,
                          ($version eq '1.0' ? () : ('accept-version' => $version,
                                                     'heart-beat' => '0,0')) });
    };
    fail("CONNECT failed: $@") if $@;
    fail('CONNECT not answered with CONNECTED') unless $reply && $reply->command eq 'CONNECTED';
    $summary{version} = $reply->headers->{version} // '1.0';
    my $ack = $version eq '1.0' ? 'client' : 'client-individual';
    $stomp->send_frame(Net::Stomp::Frame->new({ command => 'SUBSCRIBE', headers => {
        destination => $destination, id => $sub_id, ack => $ack, receipt => "sub-$run" } }));
    my $frame = $stomp->receive_frame({ timeout => 10 });
    fail('no RECEIPT for SUBSCRIBE') unless $frame && $frame->command eq 'RECEIPT';
    return $stomp;
}

my $stomp = open_subscribed();
$stomp->send_frame(Net::Stomp::Frame->new({ command => 'SEND', headers => {
    destination => $destination, 'x-run' => $run, persistent => 'true' }, body => "poison $run" }));

my $failed_at;
while (1) {
    my $wait = @{ $summary{counts} } < $expect ? $EXPECTED_SECONDS : $QUIET_SECONDS;
    my $frame = eval { $stomp->receive_frame({ timeout => $wait }) };
    fail("receiving: $@") if $@;
    last unless $frame;    # quiet: the policy took the message away
    my $h = $frame->headers;
    fail('ERROR: ' . ($h->{message} // '')) if $frame->command eq 'ERROR';
    next unless $frame->command eq 'MESSAGE' && ($h->{'x-run'} // '') eq $run;
    my $now = time;
    push @{ $summary{counts} }, ($h->{JMSXDeliveryCount} // 'missing');
    fail('more than 20 deliveries') if @{ $summary{counts} } > 20;
    push @{ $summary{gaps_ms} }, sprintf('%.1f', ($now - $failed_at) * 1000) + 0 if $failed_at;
    ($frame->body // '') eq "poison $run" or fail('the body changed on the way');
    my %name = $version eq '1.2' ? (id => $h->{ack})
             : $version eq '1.1' ? ('message-id' => $h->{'message-id'}, subscription => $sub_id)
             : ('message-id' => $h->{'message-id'});
    if (($h->{JMSXDeliveryCount} // 0) >= $ack_after) {
        $stomp->send_frame(Net::Stomp::Frame->new({ command => 'ACK', headers => {
            %name, receipt => "ack-$run" } }));
        my $r = $stomp->receive_frame({ timeout => 10 });
        fail('no RECEIPT for the ACK') unless $r && $r->command eq 'RECEIPT';
        $summary{acked} = JSON::PP::true;
        last;
    }
    $failed_at = time;
    if ($mode eq 'nack') {
        $stomp->send_frame(Net::Stomp::Frame->new({ command => 'NACK', headers => \%name }));
    } else {
        $stomp->disconnect;
        $stomp = open_subscribed();
    }
}
eval { $stomp->disconnect };
finish(1);
