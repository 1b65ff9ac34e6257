// Produces records to one topic with compression.type=zstd, for the fuzz suite (the Python
// producers have no zstd codec installed). Reads lines "partition<TAB>key<TAB>value" from
// stdin, key and value standard base64 or "-" for null; prints "partition offset" per record,
// in input order. Run: java -cp <kafka classpath> ZstdProduce.java <bootstrap> <topic>
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.Future;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class ZstdProduce {
    static byte[] decode(String s) {
        return s.equals("-") ? null : Base64.getDecoder().decode(s);
    }

    public static void main(String[] args) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", args[0]);
        p.put("compression.type", "zstd");
        p.put("acks", "all");
        p.put("linger.ms", "5");
        p.put("max.request.size", String.valueOf(16 << 20));
        p.put("key.serializer", ByteArraySerializer.class.getName());
        p.put("value.serializer", ByteArraySerializer.class.getName());
        List<Future<RecordMetadata>> sent = new ArrayList<>();
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p);
             BufferedReader in = new BufferedReader(new InputStreamReader(System.in))) {
            String line;
            while ((line = in.readLine()) != null) {
                if (line.isEmpty()) continue;
                String[] f = line.split("\t", -1);
                sent.add(producer.send(new ProducerRecord<>(args[1], Integer.parseInt(f[0]),
                        decode(f[1]), decode(f[2]))));
            }
            producer.flush();
            for (Future<RecordMetadata> f : sent) {
                RecordMetadata m = f.get();
                System.out.println(m.partition() + " " + m.offset());
            }
        }
    }
}
